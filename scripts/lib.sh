# Shared by scripts/setup, scripts/test, scripts/run and scripts/cuda-check.
# shellcheck shell=bash

CUBELM_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

# ccache (cmake/CubelmCcache.cmake) keeps its objects beside the dependency
# builds, so that every clone's build reuses them; a user's CCACHE_DIR wins.
# CCACHE_BASEDIR makes the checkout's paths relative in what ccache hashes, so a
# clone elsewhere (CI's fresh checkout) hits the objects of another.
export CCACHE_DIR=${CCACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/cubelm/ccache}
export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$CUBELM_ROOT}
export CCACHE_MAXSIZE=${CCACHE_MAXSIZE:-8G}

# Where dependency builds live: outside the checkout so that every clone and
# every build directory reuses them. Override with CUBELM_DEPS_PREFIX.
cubelm_deps_prefix() {
  echo "${CUBELM_DEPS_PREFIX:-${XDG_CACHE_HOME:-$HOME/.cache}/cubelm/deps}"
}

# Puts the nvcc at $1 on PATH for a CUDA build of cubelm: through ccache
# (scripts/nvcc-ccache, as `nvcc` in build/nvcc-ccache, which Kokkos's
# nvcc_wrapper calls) when ccache is installed and CUBELM_CCACHE is not OFF.
cubelm_cuda_path() {
  local nvcc=$1 shim=$CUBELM_ROOT/build/nvcc-ccache
  export PATH="$(dirname "$nvcc"):$PATH"
  case "${CUBELM_CCACHE:-ON}" in OFF | off | 0) return 0 ;; esac
  command -v ccache >/dev/null 2>&1 || return 0
  mkdir -p "$shim"
  ln -sfn "$CUBELM_ROOT/scripts/nvcc-ccache" "$shim/nvcc"
  export CUBELM_REAL_NVCC=$nvcc PATH="$shim:$PATH"
}

# Configures the cuda preset. CUBELM_CUDA_ARCH_FLAGS in the environment, even
# empty, replaces the preset's extra device code (sm_90 next to Kokkos' sm_80):
# empty compiles sm_80 only, in about two thirds of the time (CI's compile
# check and bundle check do; a bundle for H100/H200s needs the default).
# CUBELM_CUDA_HOST_OPT sets the host code's optimisation (default -O3, given on
# every configure so that no earlier value stays in the cache): CI's compile
# check, whose build never runs on a GPU, takes -O1, which halves the host
# compiler's share of nvcc's time (two thirds of it at -O3).
cubelm_configure_cuda() {
  local args=("-DCMAKE_CXX_FLAGS_RELEASE=${CUBELM_CUDA_HOST_OPT:--O3} -DNDEBUG")
  if [ -n "${CUBELM_CUDA_ARCH_FLAGS+set}" ]; then
    args+=("-DCUBELM_CUDA_ARCH_FLAGS=$CUBELM_CUDA_ARCH_FLAGS")
  fi
  cmake --preset cuda "${args[@]}"
}

# Configures the cpu preset (scripts/run, scripts/test). A build directory made
# here for the first time compiles src/ as unity files (CUBELM_UNITY_BUILD): the
# first build, which a new user waits for, in about two thirds of the time. An
# existing one keeps its choice; CUBELM_UNITY_BUILD=ON|OFF in the environment sets
# it either way (OFF: each edit of a source recompiles that file alone).
cubelm_configure_cpu() {
  local args=()
  case "${CUBELM_UNITY_BUILD-}" in
    ON | OFF) args+=("-DCUBELM_UNITY_BUILD=$CUBELM_UNITY_BUILD") ;;
    "") [ -f "$CUBELM_ROOT/build/cpu/CMakeCache.txt" ] || args+=(-DCUBELM_UNITY_BUILD=ON) ;;
    *) echo "cubelm: CUBELM_UNITY_BUILD is '$CUBELM_UNITY_BUILD'; it must be ON or OFF" >&2; return 2 ;;
  esac
  (cd "$CUBELM_ROOT" && cmake --preset cpu "${args[@]}")
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

# Open MPI refuses to run as root unless told.
cubelm_mpi_env() {
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
}

# CPUs of this process's affinity mask. Plain nproc would answer OMP_NUM_THREADS
# when that is set (GNU coreutils), e.g. inherited from a previous job.
cubelm_cpus() {
  env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc
}

# Physical cores this process may use: the CPUs of its affinity mask
# divided by the hardware threads per core.
cubelm_cores() {
  local cpus smt
  cpus=$(cubelm_cpus)
  smt=$(lscpu 2>/dev/null | awk -F: '/^Thread\(s\) per core/ { gsub(/ /, "", $2); print $2 }')
  [ -n "$smt" ] && [ "$smt" -ge 1 ] 2>/dev/null || smt=1
  local cores=$((cpus / smt))
  [ "$cores" -ge 1 ] || cores=1
  echo "$cores"
}

# cubelm_place RANKS: placement of RANKS ranks on this node (docs/launching.md).
# Exports the OpenMP settings and sets CUBELM_LAUNCH to the launch command
# (mpiexec with its mapping and binding options; empty for one rank).
#   ranks <= cores: each rank gets cores/ranks threads bound to as many cores
#                   of its own (--map-by slot:PE=n --bind-to core)
#   ranks >  cores: one thread each, no binding, and Open MPI told to yield
#                   the core while it waits (it busy-polls otherwise)
# An OMP_NUM_THREADS, OMP_PROC_BIND or OMP_PLACES already set is kept.
cubelm_place() {
  local ranks=$1 cores threads
  cores=$(cubelm_cores)
  CUBELM_LAUNCH=()
  if [ "$ranks" -le 1 ]; then
    export OMP_NUM_THREADS=${OMP_NUM_THREADS:-$cores}
    export OMP_PROC_BIND=${OMP_PROC_BIND:-spread} OMP_PLACES=${OMP_PLACES:-cores}
    CUBELM_PLACEMENT="1 rank, $OMP_NUM_THREADS threads on $cores cores"
    return
  fi
  local openmpi=0
  mpiexec --version 2>/dev/null | grep -E 'Open MPI|OpenRTE' >/dev/null && openmpi=1
  CUBELM_LAUNCH=(mpiexec -n "$ranks")
  if [ "$ranks" -le "$cores" ]; then
    threads=${OMP_NUM_THREADS:-$((cores / ranks))}
    export OMP_NUM_THREADS=$threads
    if [ $((ranks * threads)) -le "$cores" ]; then
      export OMP_PROC_BIND=${OMP_PROC_BIND:-close} OMP_PLACES=${OMP_PLACES:-cores}
      [ "$openmpi" = 1 ] && CUBELM_LAUNCH+=(--map-by "slot:PE=$threads" --bind-to core)
      CUBELM_PLACEMENT="$ranks ranks x $threads threads, each bound to $threads of $cores cores"
    else
      export OMP_PROC_BIND=${OMP_PROC_BIND:-false}
      [ "$openmpi" = 1 ] && CUBELM_LAUNCH+=(--bind-to none)
      CUBELM_PLACEMENT="$ranks ranks x $threads threads on $cores cores (OMP_NUM_THREADS as given; unbound)"
    fi
  else
    export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} OMP_PROC_BIND=${OMP_PROC_BIND:-false}
    export OMPI_MCA_mpi_yield_when_idle=1
    [ "$openmpi" = 1 ] && CUBELM_LAUNCH+=(--oversubscribe --bind-to none)
    CUBELM_PLACEMENT="$ranks ranks on $cores cores (oversubscribed): 1 thread each, unbound, yielding when idle"
  fi
}

# cubelm_python [MODULE...]: prints a python3 (3.11 or later, tomllib) that imports
# the modules: $CUBELM_PYTHON if set, else python3 on PATH, else Debian's
# /usr/bin/python3 (where python3-numpy and python3-matplotlib install). Fails
# with a message naming what is missing.
cubelm_python() {
  local py tried=() mods code
  mods=$(IFS=,; echo "tomllib${*:+,$*}")
  code="import sys; assert sys.version_info >= (3, 11); import $mods"
  for py in ${CUBELM_PYTHON:-python3 /usr/bin/python3}; do
    command -v "$py" >/dev/null 2>&1 || continue
    tried+=("$py")
    if "$py" -c "$code" >/dev/null 2>&1; then
      command -v "$py"
      return 0
    fi
  done
  local packages="" m
  for m in "$@"; do packages+=" python3-$m"; done
  echo "cubelm: no Python 3.11+ with ${*:-its standard library} found (tried: ${tried[*]:-none});" \
       "install python3${packages:+ and the Debian packages${packages}} (scripts/setup does)," \
       "or set CUBELM_PYTHON to a python3 that has them" >&2
  return 1
}
