# shellcheck shell=bash
# Source this to use the bundle by hand: its mpiexec on PATH and its Open MPI
# and PMIx told where they now live (they were built for /usr). The programs
# find the bundle's libraries themselves (RUNPATH $ORIGIN/../lib); cuBLAS and
# NCCL come from the node (run-checks finds them; else set LD_LIBRARY_PATH).
#   source cubelm-gpu/env.sh && mpiexec -n 2 cubelm-gpu/bin/cubelm train DECK
CUBELM_BUNDLE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
export CUBELM_BUNDLE
export PATH="$CUBELM_BUNDLE/bin:$PATH"
export OPAL_PREFIX="$CUBELM_BUNDLE" OPAL_EXEC_PREFIX="$CUBELM_BUNDLE" \
  OPAL_BINDIR="$CUBELM_BUNDLE/bin" OPAL_SBINDIR="$CUBELM_BUNDLE/bin" \
  OPAL_LIBEXECDIR="$CUBELM_BUNDLE/bin" OPAL_LIBDIR="$CUBELM_BUNDLE/lib" \
  OPAL_PKGLIBDIR="$CUBELM_BUNDLE/lib/openmpi3" OPAL_DATAROOTDIR="$CUBELM_BUNDLE/share" \
  OPAL_DATADIR="$CUBELM_BUNDLE/share" OPAL_PKGDATADIR="$CUBELM_BUNDLE/share/openmpi" \
  OPAL_SYSCONFDIR="$CUBELM_BUNDLE/etc" OPAL_INCLUDEDIR="$CUBELM_BUNDLE/include"
export PMIX_PREFIX="$CUBELM_BUNDLE/pmix" PMIX_LIBDIR="$CUBELM_BUNDLE/pmix/lib" \
  PMIX_PKGLIBDIR="$CUBELM_BUNDLE/pmix/lib/pmix" PMIX_DATAROOTDIR="$CUBELM_BUNDLE/pmix/share" \
  PMIX_DATADIR="$CUBELM_BUNDLE/pmix/share" PMIX_PKGDATADIR="$CUBELM_BUNDLE/pmix/share/pmix" \
  PMIX_SYSCONFDIR="$CUBELM_BUNDLE/pmix/share" PMIX_BINDIR="$CUBELM_BUNDLE/bin" \
  PMIX_MCA_mca_base_component_path="$CUBELM_BUNDLE/pmix/lib/pmix"
# Batch nodes often run jobs as root inside containers; Open MPI refuses that unless told.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

# Tests and checks start more ranks than a small node has cores.
export OMPI_MCA_rmaps_base_oversubscribe=${OMPI_MCA_rmaps_base_oversubscribe:-1}
# A node without ssh or rsh (containers, bare GPU nodes) and outside Slurm: Open
# MPI's default launcher refuses to start, though one node needs neither; the
# isolated launcher starts the ranks here directly.
if ! command -v ssh >/dev/null 2>&1 && ! command -v rsh >/dev/null 2>&1 &&
  ! command -v srun >/dev/null 2>&1; then
  export OMPI_MCA_plm=${OMPI_MCA_plm:-isolated}
fi
