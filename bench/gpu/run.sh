#!/usr/bin/env bash
# Builds zeropp on a GPU machine, runs the GPU tests and the GPU benchmarks
# beside their references (device copy, NCCL's own bf16 collectives, PyTorch),
# and writes logs to $OUT (or ./gpu-out). Made for the lent H200 machines:
# cJSON is not installed there, so its Debian packages travel in .deps/.
#   bench/gpu/run.sh [all|test|quant|comm|peers]
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
what=${1:-all}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
ngpu=$(nvidia-smi -L | wc -l)
log() { echo "== $*" | tee -a "$OUT/summary.txt"; }

if ! [ -f /usr/include/cjson/cJSON.h ] && [ -d .deps ]; then
  mkdir -p /tmp/cjson && for f in .deps/*.deb; do dpkg -x "$f" /tmp/cjson; done
  export CJSON_ROOT=/tmp/cjson/usr
fi
log "$(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1) x$ngpu, commit $(git rev-parse --short HEAD 2>/dev/null)"
cmake -S . -B build-gpu -DCMAKE_BUILD_TYPE=Release > "$OUT/build.log" 2>&1 &&
  cmake --build build-gpu -j"$(nproc)" >> "$OUT/build.log" 2>&1 || { log "build failed"; tail -30 "$OUT/build.log"; exit 1; }
Z=build-gpu/zeropp
MPI="mpirun --allow-run-as-root --bind-to none -x NCCL_NVLS_ENABLE -x PATH -x LD_LIBRARY_PATH"

if [ "$what" = all ] || [ "$what" = test ]; then
  log "GPU tests"
  (cd build-gpu && ctest -L gpu --output-on-failure) > "$OUT/gpu-tests.log" 2>&1
  tail -5 "$OUT/gpu-tests.log" | tee -a "$OUT/summary.txt"
fi

if [ "$what" = all ] || [ "$what" = quant ]; then
  log "quantization kernels, 1 GiB of bf16 (n = 2^29)"
  for bits in 8 4; do
    $Z bench quant --device gpu --dtype bf16 --bits $bits --n 536870912 --json
  done 2>&1 | tee "$OUT/bench-quant.jsonl" | tee -a "$OUT/summary.txt"
fi

if [ "$what" = all ] || [ "$what" = comm ]; then
  if [ "$ngpu" -ge 2 ]; then
    # 2^29 bf16 parameters = 1 GiB of weights, in one unit
    log "collectives, 2 emulated nodes over sockets (distinct NCCL_HOSTID)"
    $MPI -np 2 $Z bench comm --device gpu --params 536870912 --units 1 --node-size 1 \
      --emulate-nodes --iters 5 --json 2>&1 | tee "$OUT/bench-comm-sockets.jsonl" | tee -a "$OUT/summary.txt"
    log "collectives, one node over NVLink"
    $MPI -np 2 $Z bench comm --device gpu --params 536870912 --units 1 --node-size 2 \
      --iters 10 --json 2>&1 | tee "$OUT/bench-comm-nvlink.jsonl" | tee -a "$OUT/summary.txt"
  fi
fi

if [ "$what" = all ] || [ "$what" = peers ]; then
  if [ "$ngpu" -ge 2 ]; then
    log "peer: PyTorch NCCL collectives (coll_bw.py), NVLink and sockets"
    torchrun --standalone --nproc-per-node 2 .peer/coll_bw.py 2>&1 | grep COLL | tee -a "$OUT/summary.txt"
    $MPI -np 2 -x MASTER_ADDR=127.0.0.1 -x MASTER_PORT=29533 bash -c \
      'export RANK=$OMPI_COMM_WORLD_RANK WORLD_SIZE=$OMPI_COMM_WORLD_SIZE LOCAL_RANK=$OMPI_COMM_WORLD_LOCAL_RANK NCCL_HOSTID=zpp-peer-$OMPI_COMM_WORLD_RANK TAG=sockets; python3 .peer/coll_bw.py' \
      2>&1 | grep COLL | tee -a "$OUT/summary.txt"
  fi
fi
log "done"
