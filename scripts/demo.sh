#!/usr/bin/env bash
# The README's main command: install what is missing, build, and train a
# small decoder on 4 CPU ranks emulating 2 nodes, first with ZeRO-3 and then
# with ZeRO++, ending with a side-by-side summary and a picture of both runs
# (loss, validation loss, tokens/s, cross-node bytes per step; needs gnuplot).
#
#   scripts/demo.sh [--model gpt2|llama] [zeropp train options ...]
#
# --model gpt2 (the default): the demo's GPT-2 (4 layers x 128). --model
# llama: a Llama of the same depth and width (docs/config.md, "Model
# families"): grouped-query attention with 2 key/value heads for 4 query
# heads, a SwiGLU MLP 384 wide, an untied head, RoPE with Llama 3's base.
# The other options go to `zeropp train --demo` (--steps N, --data FILE, ...).
set -euo pipefail
cd "$(dirname "$0")/.."
model=gpt2
args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --model) [ $# -ge 2 ] || { echo "demo.sh: --model takes gpt2 or llama" >&2; exit 2; }
             model="$2"; shift 2 ;;
    --model=*) model="${1#--model=}"; shift ;;
    *) args+=("$1"); shift ;;
  esac
done
case "$model" in
  gpt2) family=() ;;
  llama) family=(--set model.family=llama --set model.n_kv_head=2 --set model.n_ffn=384
                 --set model.untied_head=true --set model.rope_theta=500000) ;;
  *) echo "demo.sh: --model '$model': give gpt2 or llama" >&2; exit 2 ;;
esac
scripts/install-deps.sh
scripts/build.sh build
export OMPI_MCA_mpi_yield_when_idle=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OPENBLAS_NUM_THREADS=1
if [ -t 1 ]; then export ZPP_PROGRESS=1; fi
metrics=build/demo_metrics.jsonl
picture=build/demo.png
[ "$model" = gpt2 ] || { metrics=build/demo_${model}_metrics.jsonl; picture=build/demo_${model}.png; }
mpirun -np 4 --oversubscribe --bind-to none build/zeropp train --demo --metrics "$metrics" \
  ${family[@]+"${family[@]}"} ${args[@]+"${args[@]}"}
echo
if build/zeropp plot "$metrics" --out "$picture" \
     --title "ZeRO-3 vs ZeRO++ (zeropp train --demo, $model)"; then
  echo "picture: $(pwd)/$picture"
else
  echo "no picture (see the line above); the metrics are in $(pwd)/$metrics"
fi
