# Shared by scripts/setup, scripts/test, scripts/run and scripts/cuda-check.
# shellcheck shell=bash

CUBELM_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

# Where dependency builds live: outside the checkout so that every clone and
# every build directory reuses them. Override with CUBELM_DEPS_PREFIX.
cubelm_deps_prefix() {
  echo "${CUBELM_DEPS_PREFIX:-${XDG_CACHE_HOME:-$HOME/.cache}/cubelm/deps}"
}

# The nvcc to use for the CUDA variant, or nothing.
cubelm_find_nvcc() {
  if command -v nvcc >/dev/null 2>&1; then
    command -v nvcc
  elif [ -x "${CUDA_HOME:-/usr/local/cuda}/bin/nvcc" ]; then
    echo "${CUDA_HOME:-/usr/local/cuda}/bin/nvcc"
  fi
}

# Sets Kokkos_ROOT and KokkosKernels_ROOT for a variant (host|cuda): the
# user's own installation when given, else the one scripts/setup built.
cubelm_kokkos_env() {
  local variant=$1 prefix
  prefix=$(cubelm_deps_prefix)
  if [ "$variant" = host ]; then
    export Kokkos_ROOT="${Kokkos_ROOT:-$prefix/host/kokkos}"
    export KokkosKernels_ROOT="${KokkosKernels_ROOT:-$prefix/host/kokkos-kernels}"
  else
    export Kokkos_ROOT="${CUBELM_CUDA_KOKKOS_ROOT:-$prefix/cuda/kokkos}"
    export KokkosKernels_ROOT="${CUBELM_CUDA_KOKKOSKERNELS_ROOT:-$prefix/cuda/kokkos-kernels}"
  fi
}

# Runs a command and prints how long it took.
cubelm_timed() {
  local label=$1 start end
  shift
  local rc=0
  start=$(date +%s)
  "$@" || rc=$?
  end=$(date +%s)
  echo "cubelm: ${label}: $((end - start)) s"
  return "$rc"
}

# Open MPI refuses to run as root and to oversubscribe cores unless told.
cubelm_mpi_env() {
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
  export OMPI_MCA_rmaps_base_oversubscribe=1
}
