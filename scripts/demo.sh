#!/usr/bin/env bash
# The README's main command: install what is missing, build, and train a
# small GPT on 4 CPU ranks emulating 2 nodes, first with ZeRO-3 and then with
# ZeRO++, ending with a side-by-side summary.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
scripts/build.sh build
export OMPI_MCA_mpi_yield_when_idle=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OPENBLAS_NUM_THREADS=1
if [ -t 1 ]; then export ZPP_PROGRESS=1; fi
exec mpirun -np 4 --oversubscribe --bind-to none build/zeropp train --demo "$@"
