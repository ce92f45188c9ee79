# Kokkos Kernels' own CMake package exports Kokkos::kokkoskernels. Trilinos'
# packaging of it (Trilinos >= 14, e.g. Debian's libtrilinos-kokkos-kernels-dev)
# exports KokkosKernels::all_libs instead. cubelm links Kokkos::kokkoskernels;
# give it that name when only Trilinos' one exists. Included after
# find_package(KokkosKernels), by the build and by the installed package.
if(NOT TARGET Kokkos::kokkoskernels)
  if(TARGET KokkosKernels::all_libs)
    add_library(Kokkos::kokkoskernels INTERFACE IMPORTED)
    set_target_properties(Kokkos::kokkoskernels PROPERTIES
                          INTERFACE_LINK_LIBRARIES KokkosKernels::all_libs)
  else()
    message(FATAL_ERROR
      "The KokkosKernels package found at ${KokkosKernels_DIR} defines neither "
      "Kokkos::kokkoskernels (Kokkos Kernels' own package) nor KokkosKernels::all_libs "
      "(Trilinos' packaging). Point KokkosKernels_ROOT at a Kokkos Kernels installation.")
  endif()
endif()
