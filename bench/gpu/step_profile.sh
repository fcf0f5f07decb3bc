#!/usr/bin/env bash
# Where one training step goes, kernel by kernel, ours against llm.c at llm.c's two shapes
# (GPT 1.31B mb 4, GPT-2 124M mb 8; T 1024, bf16), on one GPU:
#   bash bench/gpu/step_profile.sh            profile and summarise (needs ncu, a GPU,
#                                             build-gpu/zeropp and build-gpu/llmc:
#                                             `bash bench/train/race.sh prep` builds both)
#   bash bench/gpu/step_profile.sh sum FILE...summarise captures made before (ncu --csv,
#                                             or timeline's trace_*.tsv; gzipped or not),
#                                             no GPU needed
#   bash bench/gpu/step_profile.sh timeline   the wall time between the kernels instead:
#                                             each system runs STEPS (12) steps at full
#                                             speed under a CUPTI trace
#                                             (build-gpu/bench/libzpp_cupti_trace.so, built
#                                             here if missing), and build-gpu/bench/zpp_timeline
#                                             splits each steady step into busy time and the
#                                             gaps where the GPU waited for the host or for
#                                             itself (bench/gpu/trace/timeline.c says how)
# One step of each system runs under `ncu --metrics gpu__time_duration.sum` (each kernel's
# own time: gaps between kernels are not counted). The step is ours from embed_forward to
# the last AdamW launch, llm.c's between two encoder_forward launches. Kernels are summed
# into the rows bench/RESULTS.md compares; "first step only" are the launches that only a
# first step makes (ours: the resident bf16 copy made from the masters; llm.c: its masters
# made from the parameters), which "steady" leaves out. Output in $OUT (default
# ./profile-out): ncu_NAME.csv.gz and summary.txt.
#   TIMEOUT=150 s each capture
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
OUT=${OUT:-$PWD/profile-out} TIMEOUT=${TIMEOUT:-150} STEPS=${STEPS:-12}
mkdir -p "$OUT" && OUT=$(cd "$OUT" && pwd) # absolute: the runs start in other folders

summarise() { # CSV or TSV... -> one table per capture (ncu's CSV) or trace (timeline's TSV)
  python3 - "$@" << 'PY'
import csv, gzip, re, subprocess, sys
ROWS = [  # (row, test on the kernel's name); the first that matches takes the kernel
    ("first step only", lambda k: "k_convert" in k or "copy_and_cast" in k),
    ("attention (cuDNN or ours)", lambda k: "cudnn" in k or "attention" in k or "sdpa" in k),
    ("AdamW", lambda k: "adamw" in k),
    ("gradient norm", lambda k: "sumsq" in k or "norm_squared" in k or "global_sum" in k),
    ("cross-entropy", lambda k: "cross_entropy" in k or "classifier" in k),
    ("products (with their epilogues; llm.c: + its GELU)", lambda k: re.search(
        r"nvjet|gemm|xmma|cutlass|gelu_forward_kernel2|gelu_backward_inplace", k) is not None),
    ("LayerNorm backward, bias and weight sums", lambda k: re.search(
        r"layernorm_backward|rowgroup_finish|colsum|widen_kernel|add_sums|matmul_backward_bias|reduce_add_sum", k)),
    ("LayerNorm forward, recomputes, GELU recompute", lambda k: re.search(
        r"layernorm_forward|layernorm_recompute|fused_residual|gelu_forward_kernel<", k)),
    ("embeddings and the rest", lambda k: True),
]
def rows_of(path):
    f = gzip.open(path, "rt") if path.endswith(".gz") else open(path)
    lines = [l for l in f if l.startswith('"')]
    return [(r["Kernel Name"], float(r["Metric Value"].replace(",", "")))
            for r in csv.DictReader(lines) if r.get("Metric Name") == "gpu__time_duration.sum"]
def ncu_step(path):
    """One step of an ncu capture: its kernels (name, ns), or an error."""
    ks = rows_of(path)
    names = [k for k, _ in ks]
    start = "embed_forward" if any("embed_forward" in k for k in names) else "encoder_forward"
    marks = [i for i, k in enumerate(names) if start in k]
    if not marks:
        return None, f"no {start} launch captured ({len(ks)} kernels)"
    # the first window between two step starts that holds an AdamW launch (a
    # training step, not an evaluation's forward); ours ends at its last AdamW
    bounds = marks + [len(ks)]
    for a, b in zip(bounds, bounds[1:]):
        ad = [i for i in range(a, b) if "adamw" in names[i]]
        if ad:
            return ks[a:(ad[-1] + 1 if start == "embed_forward" else b)], None
    return None, f"no AdamW launch after {start}"
def trace_step(path):
    """The median steady step of a CUPTI trace (step_profile.sh timeline): from one
    step start to the next, the first two left out; its kernels at full clocks."""
    f = gzip.open(path, "rt") if path.endswith(".gz") else open(path)
    ks = sorted((int(p[1]), int(p[2]), p[5]) for p in (l.rstrip("\n").split("\t", 5) for l in f)
                if p[0] == "K")
    names = subprocess.run(["c++filt"], input="\n".join(k[2] for k in ks), text=True,
                           capture_output=True).stdout.split("\n")
    start = "embed_forward" if any("embed_forward" in k for k in names) else "encoder_forward"
    marks = [ks[i][0] for i, k in enumerate(names[:len(ks)]) if start in k]
    wins = sorted(zip(marks[2:], marks[3:]), key=lambda w: w[1] - w[0])
    if not wins:
        return None, f"fewer than 4 {start} launches ({len(ks)} kernels)"
    a, b = wins[len(wins) // 2]
    return [(n, e - s) for (s, e, _), n in zip(ks, names) if a <= s < b], (b - a) / 1e6
for path in sys.argv[1:]:
    wall = None
    if ".tsv" in path:
        step, wall = trace_step(path)
    else:
        step, err = ncu_step(path)
    if step is None:
        print(f"{path}: {wall or err}"); continue
    sums = {r: 0.0 for r, _ in ROWS}
    for k, t in step:
        sums[next(r for r, test in ROWS if test(k))] += t / 1e6
    total = sum(sums.values())
    head = f"{path}: {len(step)} launches, {total:.2f} ms of kernels a step"
    if wall is not None:
        print(f"{head} (the median steady step; its wall time {wall:.2f} ms)")
    else:
        print(f"{head}, {total - sums['first step only']:.2f} ms steady")
    for r, _ in ROWS:
        print(f"  {sums[r]:8.2f} ms  {r}")
PY
}

if [ "${1:-}" = sum ]; then shift; summarise "$@"; exit; fi
mode=${1:-ncu}

[ -x build-gpu/zeropp ] && [ -x build-gpu/llmc/train_gpt2cu ] ||
  { echo "build-gpu/zeropp or build-gpu/llmc missing: run bash bench/train/race.sh prep first"; exit 2; }
# llm.c's d12: the race's 124M config with heads of 64, as its h64 variant makes it
cfg124=$OUT/gpt_124m_h64.json
sed -E 's/("n_head": *)[0-9]+/\112/' bench/train/gpt_124m_zero3.json > "$cfg124"
LM="-t 1024 -v 100000 -s 0 -m 1 -i tokens.bin -j tokens.bin"

if [ "$mode" = timeline ]; then
  lib=$PWD/build-gpu/bench/libzpp_cupti_trace.so tl=$PWD/build-gpu/bench/zpp_timeline
  [ -f "$lib" ] && [ -x "$tl" ] ||
    cmake --build build-gpu --target zpp_timeline zpp_cupti_trace > "$OUT/trace-build.log" 2>&1
  [ -f "$lib" ] && [ -x "$tl" ] ||
    { echo "$lib or $tl missing: no CUPTI in this CUDA toolkit? ($OUT/trace-build.log)"; exit 2; }
  trace() { # NAME DIR BEGIN_REGEX CMD...: the trace, gzipped, and timeline_NAME.txt
    local name=$1 dir=$2 begin=$3; shift 3
    (cd "$dir" && CUDA_INJECTION64_PATH=$lib ZPP_TRACE_OUT=$OUT/trace_$name.tsv \
      timeout "$TIMEOUT" "$@") > "$OUT/trace_$name.log" 2>&1 ||
      echo "$name: exited $? (see $OUT/trace_$name.log)"
    # the first two steps warm up (llm.c's first window is its step-0 evaluation)
    "$tl" "$OUT/trace_$name.tsv" "$begin" 2 5 20 | c++filt > "$OUT/timeline_$name.txt"
    gzip -f "$OUT/trace_$name.tsv"
  }
  ours="build-gpu/zeropp train --device gpu --steps $STEPS --quiet --config"
  # shellcheck disable=SC2086
  {
    trace ours_1p3b . embed_forward $ours bench/train/gpt_1p3b_zero3.json
    trace ours_124m . embed_forward $ours "$cfg124"
    trace llmc_1p3b build-gpu/llmc encoder_forward ./train_gpt2cu -e gpt3:c2048 -b 4 -d 4096 -x "$STEPS" $LM
    trace llmc_124m build-gpu/llmc encoder_forward ./train_gpt2cu -e d12 -b 8 -d 8192 -x "$STEPS" $LM
  }
  for n in ours_1p3b llmc_1p3b ours_124m llmc_124m; do
    sed -n '1,4p' "$OUT/timeline_$n.txt"
  done | tee "$OUT/summary.txt"
  summarise "$OUT"/trace_ours_1p3b.tsv.gz "$OUT"/trace_llmc_1p3b.tsv.gz \
    "$OUT"/trace_ours_124m.tsv.gz "$OUT"/trace_llmc_124m.tsv.gz | tee -a "$OUT/summary.txt"
  exit
fi

NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
[ -x "$NCU" ] || { echo "ncu not found: put Nsight Compute's ncu on PATH"; exit 2; }
capture() { # NAME DIR CMD...
  local name=$1 dir=$2; shift 2
  (cd "$dir" && timeout "$TIMEOUT" "$NCU" --clock-control none --metrics gpu__time_duration.sum \
    --csv --print-units base "$@") > "$OUT/ncu_$name.csv" 2> "$OUT/ncu_$name.err" ||
    echo "$name: ncu exited $? (see $OUT/ncu_$name.err)"
  gzip -f "$OUT/ncu_$name.csv"
}
LM="-x 1 $LM"
capture ours_1p3b . build-gpu/zeropp train --device gpu --config bench/train/gpt_1p3b_zero3.json --steps 1 --quiet
capture ours_124m . build-gpu/zeropp train --device gpu --config "$cfg124" --steps 1 --quiet
# shellcheck disable=SC2086
capture llmc_1p3b build-gpu/llmc ./train_gpt2cu -e gpt3:c2048 -b 4 -d 4096 $LM
# shellcheck disable=SC2086
capture llmc_124m build-gpu/llmc ./train_gpt2cu -e d12 -b 8 -d 8192 $LM
summarise "$OUT"/ncu_ours_1p3b.csv.gz "$OUT"/ncu_llmc_1p3b.csv.gz "$OUT"/ncu_ours_124m.csv.gz \
  "$OUT"/ncu_llmc_124m.csv.gz | tee "$OUT/summary.txt"
