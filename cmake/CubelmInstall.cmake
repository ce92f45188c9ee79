# Installs the library, headers and command, and exports the CMake package
# `cubelm::cubelm` so that other projects can `find_package(cubelm)`.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

install(TARGETS cubelm_core cubelm_comm cubelm_kernels cubelm_pipeline cubelm_tp cubelm_toml cubelm_io cubelm_cost
                cubelm_model cubelm_train cubelm_app cubelm_all cubelm_exe
        EXPORT cubelmTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
        RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(DIRECTORY include/cubelm DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(FILES ${CUBELM_GENERATED_INCLUDE_DIR}/cubelm/core/version.hpp
        DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/cubelm/core)

set(CUBELM_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/cubelm)
install(EXPORT cubelmTargets NAMESPACE cubelm:: DESTINATION ${CUBELM_CMAKE_DIR})
configure_package_config_file(cmake/cubelmConfig.cmake.in
                              ${CMAKE_CURRENT_BINARY_DIR}/cubelmConfig.cmake
                              INSTALL_DESTINATION ${CUBELM_CMAKE_DIR})
write_basic_package_version_file(${CMAKE_CURRENT_BINARY_DIR}/cubelmConfigVersion.cmake
                                 COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/cubelmConfig.cmake
              ${CMAKE_CURRENT_BINARY_DIR}/cubelmConfigVersion.cmake
              cmake/FindNCCL.cmake
              cmake/CubelmKokkosKernels.cmake
        DESTINATION ${CUBELM_CMAKE_DIR})
