#!/usr/bin/env bash
# Runs a command and prints its output (stdout and stderr together) without the one
# warning cubelm gives where the environment sets OPENBLAS_CORETYPE to kernels below the
# processor: that is the machine's setting, kept and tested by blas_kernels.sh, and the
# CLI tests that compare cubelm's exact output must pass on such machines too. Exits
# with the command's status.
"$@" 2>&1 | grep -v -E '^cubelm: warning: .* because the environment sets OPENBLAS_CORETYPE='
exit "${PIPESTATUS[0]}"
