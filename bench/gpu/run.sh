#!/usr/bin/env bash
# One call on a GPU machine (one H200 or more): build, the GPU tests
# (ctest -L gpu), the quantization kernels beside a device copy, and every
# collective path beside NCCL's own bf16 collective, over sockets between two
# emulated nodes and (with 2 GPUs or more) over NVLink. With one GPU the two
# ranks share it, each its own emulated node (a distinct NCCL_HOSTID), so
# every multi-rank step runs over sockets. Logs and JSON lines go to
# $OUT/summary.txt.
# Each step has its own time limit so one slow step cannot eat the lease.
#   EXTRA=1   also qwZ and qgZ over more sockets per peer (NCCL_SOCKET_NTHREADS=4,
#             NCCL_NSOCKS_PERTHREAD=4 for both ours and NCCL's reference)
#   GRAD_BLOCK=B  also qgZ over sockets with int4 blocks of B (a planner's
#             bytes-for-accuracy knob; the default is 128)
#   SLABS=1   also qgZ's pipeline in its other settings, to show what it gains:
#             over NVLink in one step (--grad-slab off), over sockets in 8 slabs
#   TRAIN=1   also a short `zeropp train --device gpu` beside the same run on the CPU
#   PEERS=1   also PyTorch's collectives (.peer/coll_bw.py, a copy of
#             ../shared/bench/coll_bw.py carried with the call)
# cJSON is not installed on those machines: carry its Debian packages in
# .deps/ (apt-get download libcjson1 libcjson-dev).
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-$PWD/gpu-out}; mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
S="$OUT/summary.txt"
if ! [ -f /usr/include/cjson/cJSON.h ]; then
  mkdir -p /tmp/cjson && for f in .deps/*.deb; do dpkg -x "$f" /tmp/cjson; done
  export CJSON_ROOT=/tmp/cjson/usr
fi
GPUS=$(nvidia-smi -L | wc -l)
echo "$(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1) x$GPUS" | tee "$S"
t0=$(date +%s)
cmake -S . -B build-gpu -DCMAKE_BUILD_TYPE=Release > "$OUT/build.log" 2>&1 &&
  cmake --build build-gpu -j"$(nproc)" >> "$OUT/build.log" 2>&1 || { echo "build failed" | tee -a "$S"; tail -40 "$OUT/build.log"; exit 1; }
echo "built in $(( $(date +%s) - t0 ))s" | tee -a "$S"
Z=build-gpu/zeropp
# the bench's host-side checks use OpenMP: share the cores between 2 ranks
export OMP_NUM_THREADS=$(( $(nproc) / 2 ))
MPI="mpirun --allow-run-as-root --bind-to none -np 2 -x NCCL_NVLS_ENABLE -x OMP_NUM_THREADS"
(cd build-gpu && timeout ${TEST_LIMIT:-120} ctest -L gpu --output-on-failure) > "$OUT/gpu-tests.log" 2>&1
grep -E "tests passed|FAILED|Failed|Passed" "$OUT/gpu-tests.log" | tail -12 | tee -a "$S"
for bits in 8 4; do
  timeout 60 $Z bench quant --device gpu --dtype bf16 --bits $bits --n 536870912 --json
done 2>&1 | tee -a "$S"
timeout 240 $MPI $Z bench comm --device gpu --params 536870912 --units 1 --node-size 1 \
  --emulate-nodes --iters ${SOCKET_ITERS:-15} --modes ${SOCKET_MODES:-zero3,qwz,qgz,zeropp} --json 2>&1 | tee -a "$S"
if [ "$GPUS" -ge 2 ]; then
  timeout 150 $MPI $Z bench comm --device gpu --params 536870912 --units 1 --node-size 2 \
    --iters 9 --json 2>&1 | sed 's/^/nvlink /' | tee -a "$S"
fi
if [ -n "${SLABS:-}" ] && [ "$GPUS" -ge 2 ]; then
  NV="$Z bench comm --device gpu --params 536870912 --units 1 --node-size 2 --iters 9 --modes zero3,qgz --json"
  timeout 60 $MPI $NV --grad-slab off 2>&1 | sed 's/^/one-step nvlink /' | tee -a "$S"
  timeout 150 $MPI $Z bench comm --device gpu --params 536870912 --units 1 --node-size 1 \
    --emulate-nodes --iters ${SOCKET_ITERS:-15} --modes zero3,qgz --grad-slab 33554432 --json \
    2>&1 | sed 's/^/8-slabs /' | tee -a "$S"
fi
if [ -n "${GRAD_BLOCK:-}" ]; then
  timeout 150 $MPI $Z bench comm --device gpu --params 536870912 --units 1 --node-size 1 \
    --emulate-nodes --iters ${SOCKET_ITERS:-15} --modes zero3,qgz --grad-block $GRAD_BLOCK --json \
    2>&1 | sed "s/^/grad$GRAD_BLOCK /" | tee -a "$S"
fi
if [ "$(nvidia-smi -L | wc -l)" -ge 4 ]; then
  # Issue 6: 2 emulated nodes x 2 GPUs — NVLink inside a node (qgZ's intra
  # all-to-all, hpZ's gather), sockets between nodes.
  timeout 240 mpirun --allow-run-as-root --bind-to none -np 4 -x NCCL_NVLS_ENABLE -x OMP_NUM_THREADS=$(( $(nproc) / 4 )) $Z bench comm \
    --device gpu --params 536870912 --units 1 --node-size 2 --emulate-nodes --iters 3 --json \
    2>&1 | sed 's/^/x4 /' | tee -a "$S"
fi
if [ -n "${EXTRA:-}" ]; then
  timeout 120 $MPI -x NCCL_SOCKET_NTHREADS=4 -x NCCL_NSOCKS_PERTHREAD=4 $Z bench comm --device gpu \
    --params 536870912 --units 1 --node-size 1 --emulate-nodes --iters 5 --modes qwz,qgz --json \
    2>&1 | sed 's/^/socks16 /' | tee -a "$S"
fi
if [ -n "${TRAIN:-}" ]; then
  # the example config (GPT-2 4 x 128, 2 ranks as one node; on one GPU, as
  # two emulated nodes): the CUDA model and the CPU model should trace the
  # same loss curve to within fp32 noise
  SHARE=""; [ "$GPUS" -lt 2 ] && SHARE="--node-size 1 --emulate-nodes"
  for dev in gpu cpu; do
    timeout 120 $MPI $Z train --device $dev --config examples/zeropp.json --steps 100 --quiet \
      $([ $dev = gpu ] && echo "$SHARE") \
      --metrics "$OUT/train-$dev.jsonl" > "$OUT/train-$dev.log" 2>&1
    echo "train $dev rc=$? $(tail -2 "$OUT/train-$dev.log" | tr '\n' ' ')" | tee -a "$S"
  done
fi
if [ -n "${PEERS:-}" ] && [ -f .peer/coll_bw.py ]; then
  timeout 120 torchrun --standalone --nproc-per-node 2 .peer/coll_bw.py 2>&1 | grep COLL | tee -a "$S"
  timeout 180 $MPI -x MASTER_ADDR=127.0.0.1 -x MASTER_PORT=29533 bash -c \
    'export RANK=$OMPI_COMM_WORLD_RANK WORLD_SIZE=$OMPI_COMM_WORLD_SIZE LOCAL_RANK=$OMPI_COMM_WORLD_LOCAL_RANK NCCL_HOSTID=zpp-peer-$OMPI_COMM_WORLD_RANK TAG=sockets; python3 .peer/coll_bw.py' \
    2>&1 | grep COLL | tee -a "$S"
fi
echo "total $(( $(date +%s) - t0 ))s" | tee -a "$S"
