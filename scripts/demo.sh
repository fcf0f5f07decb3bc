#!/usr/bin/env bash
# The README's main command: install what is missing, build, and train a
# small GPT on 4 CPU ranks emulating 2 nodes, first with ZeRO-3 and then with
# ZeRO++, ending with a side-by-side summary and a picture of both runs
# (loss, validation loss, tokens/s, cross-node bytes per step; needs gnuplot).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
scripts/build.sh build
export OMPI_MCA_mpi_yield_when_idle=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OPENBLAS_NUM_THREADS=1
if [ -t 1 ]; then export ZPP_PROGRESS=1; fi
metrics=build/demo_metrics.jsonl
picture=build/demo.png
mpirun -np 4 --oversubscribe --bind-to none build/zeropp train --demo --metrics "$metrics" "$@"
echo
if build/zeropp plot "$metrics" --out "$picture" --title "ZeRO-3 vs ZeRO++ (zeropp train --demo)"; then
  echo "picture: $(pwd)/$picture"
else
  echo "no picture (see the line above); the metrics are in $(pwd)/$metrics"
fi
