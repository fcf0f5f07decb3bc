#!/usr/bin/env bash
# The end-to-end race: `zeropp train --device gpu` (ZeRO-3 and ZeRO++ = qwZ + qgZ)
# against PyTorch FSDP2 and DeepSpeed 0.19.8 (ZeRO-3, ZeRO++), and on one GPU against
# llm.c (the C/CUDA GPT-2 trainer), one after the other in the same call on the same
# GPU machine, with the same model shape and batch.
#
#   bash bench/train/race.sh PART...       PART is one of
#     prep           build build-gpu/zeropp and llm.c (build-gpu/llmc); install the
#                    DeepSpeed wheels and JIT-build its quantizer op (all kept in
#                    build-gpu/ for the next call on a warm machine); every part
#                    does this itself when it needs it, prep just does it up front
#     linkcheck      PyTorch's NCCL all-gather / reduce-scatter / all-to-all
#                    between the 2 emulated nodes on the call's link, with
#                    NCCL's default socket settings and with the race's (SOCKS)
#     world1         1 GPU, world 1 (compute alone): GPT 1.31B mb4 and GPT-2 124M
#                    mb8, ours (ZeRO-3 config) and FSDP2 (DS1=1: DeepSpeed ZeRO-3 too)
#     world1llmc     1 GPU, world 1: ours against llm.c on llm.c's shapes, GPT 1.31B
#                    mb4 (16 heads of 128; ours also with the acts variant) and
#                    GPT-2 124M mb8 (12 heads of 64: ours with the h64 variant)
#     big            1 GPU, world 1: GPT 6.7B (32 x 4096, 32 heads of 128) mb1, ours
#                    (ZeRO-3 at its defaults), FSDP2 and llm.c
#     fit [lN..]     1 GPU, world 1: the largest GPT that fits, GPT w4096lN (width
#                    4096, 32 heads of 128, N layers: 12 N 4096^2 + 50304 x 4096
#                    parameters) mb1 at each depth given (default l36 l40 l44 l48),
#                    ours (ZeRO-3 at its defaults: in bf16 its resident copy is the
#                    split masters' high half, so dropping it saves nothing) and
#                    FSDP2; the largest N a system
#                    runs with status ok is its answer. llm.c's descriptors fix the
#                    depth a width has (gpt3:c4096 is 32 layers, the next, c5120, a
#                    13B), so its largest is `big`'s 6.7B
#     llama          1 GPU, world 1: a Llama-3.2-1B shape (16 x 2048, 32 heads, 8 KV
#                    heads, FF 8192, V 128256, T 2048) mb1, ours (ZeRO-3) and FSDP2
#                    (fsdp_llama.py)
#     llamanodes [mbN..] the same Llama on 2 ranks as 2 emulated nodes at each
#                    micro-batch given (default mb1 mb2): ours ZeRO-3 and ZeRO++, FSDP2
#     nodes2 [mbN..] 2 ranks as 2 emulated nodes, GPT 1.31B at each micro-batch
#                    given (default mb1 mb4): ours ZeRO-3 and ZeRO++, FSDP2,
#                    DeepSpeed ZeRO-3 and ZeRO++, each at its defaults
#     RUN            one run by name, SETTING-MODEL-mbN-SYSTEM[+VARIANT...], e.g.
#                    nodes2-1p3b-mb4-ds_zeropp+rbs1e7 (SYSTEM: ours_zero3
#                    ours_zeropp fsdp2 ds_zero3 ds_zeropp llmc; MODEL: 1p3b 124m
#                    6p7b w4096lN llama1b; llmc at world1 only and not w4096lN,
#                    DeepSpeed GPT only)
#   VARIANTs, each a setting of the system's own (the race compares every
#   system at the best variant it ran in the call; the report says which):
#     ours:     keep       stage3_max_reuse_distance 1e12: every unit gathered in
#                          the forward stays for its backward (no backward gathers)
#               h64        heads of 64 (n_head = D / 64), llm.c's GPT-2 shape; the
#                          configs and fsdp_gpt.py use heads of 128
#               noresident zeropp_resident_weights false: no bf16 copy of the
#                          weights kept between steps at world 1 (in bf16 it
#                          costs no memory: the masters are split)
#               acts       zeropp.keep_activations true: the LayerNorm and GELU
#                          outputs kept for the backward, not recomputed
#               lnacts     zeropp.keep_activations "layernorm": the LayerNorm
#                          outputs only (what fits llm.c's memory at 124M mb 8)
#     fsdp2:    raf0|raf1  reshard_after_forward False|True (default True)
#               compile    torch.compile each block (costs ~1 min of start-up)
#     ds_*:     rbsX       reduce_bucket_size X (default 5e8; ZeRO++'s tutorial: 1e7)
#               keep       stage3_max_live_parameters and _reuse_distance 1e12:
#                          DeepSpeed's way of keeping gathered weights
#   DRY=1 prints the commands instead of running them (no GPU needed).
#
# THE LINK. LINK=RATE (e.g. 25gbit, the default) caps each emulated node's
# incoming traffic at RATE with Linux traffic control (bench/train/link.sh,
# needs root), so all of a node's connections share one rate, as on a NIC.
# LINK=socket leaves the loopback sockets uncapped (the old setting, where
# every extra connection adds bandwidth). If traffic control is refused the
# call says why and runs LINK=socket, recorded as such in every line. Every
# system gets the same NCCL socket settings, SOCKS=THREADSxSOCKETS (default
# 4x4: NCCL_SOCKET_NTHREADS x NCCL_NSOCKS_PERTHREAD), so no system's lead comes
# from opening more connections than another.
#
# Output in $OUT (default ./race-out): race.tsv, one line a run: setting model
# micro_batch system variant tokens_per_s peak_mem_MiB steps status (ok failed
# timeout skipped_budget build_failed jit_failed peer_setup_failed no_peer_copy)
# warm ranks gpus self_mem_MiB mem_src transport link socks link_MB wall_s note
# run call utc. `call` names the call (its start, UTC, and the machine), the
# same on every line of one invocation: bench/train/report.sh compares runs of
# one call only. link_MB: bytes that crossed the capped link during the run
# (start-up and every step), from the shaper's counters. NAME.log for each run
# (NAME.jsonl: our metrics; mem/NAME.*: the memory samples), build.log,
# peers-setup.log, race.txt (what was printed). A device call brings back at
# most 8 files, so at the end everything but race.tsv and race.txt is packed
# into race-logs-UTC.tgz (PACK=0 leaves the files as they are).
# tokens/s: global tokens / the median step time of steps WARM+1..STEPS (WARM=3,
# what fsdp_gpt.py hard-codes; the others are told the same; upper middle for an
# even count, as fsdp_gpt.py). peak_mem_MiB: the most memory one rank held, from
# nvidia-smi sampled every 100 ms: per process when the driver lists processes
# (mem_src=proc), else the GPU's memory.used above its idle level divided by the
# ranks on it (mem_src=gpu). self_mem_MiB: what the system says of itself (ours:
# device_peak_bytes; peers: torch's max_memory_allocated). transport: what NCCL
# says it used (NET/Socket between emulated nodes). A run that fails or times
# out is recorded and the race goes on.
#   STEPS=8  RUN_TMO=240 s a run  BUDGET=570 s the call  JIT_TMO=300 s
#   DS_ENV="LSP=12 ..." more of ds_gpt.py's knobs for every DeepSpeed run
#   LINKCHECK_SOCKS="1x1 4x4" the socket settings linkcheck tries (default 1x1 and SOCKS)
# The peers run exactly as ds_peer.sh runs them (its environment, emu_rank.sh,
# mpirun, torchrun when mpirun dies at start), with the variant's settings.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
ROOT=$PWD
OUT=${OUT:-$ROOT/race-out}; mkdir -p "$OUT"
TSV=$OUT/race.tsv
STEPS=${STEPS:-8} WARM=3 RUN_TMO=${RUN_TMO:-240} BUDGET=${BUDGET:-570} JIT_TMO=${JIT_TMO:-300}
MIN_RUN=${MIN_RUN:-60} DRY=${DRY:-0} DS1=${DS1:-0} LINK=${LINK:-25gbit} SOCKS=${SOCKS:-4x4}
PEERS=$ROOT/.peers EMU=$ROOT/.peers/deepspeed/emu_rank.sh LLMC_BUILD=$ROOT/build-gpu/llmc
SITE=$ROOT/build-gpu/peers/site
[ "$STEPS" -gt "$WARM" ] || { echo "STEPS must exceed $WARM (fsdp_gpt.py drops 3 warm-up steps)"; exit 2; }
[[ $SOCKS =~ ^([0-9]+)x([0-9]+)$ ]] || { echo "SOCKS must be THREADSxSOCKETS, e.g. 4x4"; exit 2; }
LINKSH=$ROOT/bench/train/link.sh
CALL="$(date -u +%Y%m%dT%H%M%SZ)-$(hostname -s 2> /dev/null || echo host)"

# What every rank of every system sees. NVLS off: multicast is not lent. The
# NCCL INIT/NET lines show which transport each run used (sockets between nodes).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET PYTHONUNBUFFERED=1
# the same socket settings for every system (see THE LINK above)
export NCCL_SOCKET_NTHREADS=${BASH_REMATCH[1]} NCCL_NSOCKS_PERTHREAD=${BASH_REMATCH[2]}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# DeepSpeed's settings, as in ds_peer.sh: sm_90 only, ops JIT-built (once, kept)
export TORCH_CUDA_ARCH_LIST=9.0 DS_BUILD_OPS=0 DS_ACCELERATOR=cuda
export TORCH_EXTENSIONS_DIR=$ROOT/build-gpu/peers/torch_ext MAX_JOBS=${MAX_JOBS:-$(nproc)}
if [ -z "${CUDA_HOME:-}" ] && command -v nvcc > /dev/null; then
  CUDA_HOME=$(dirname "$(dirname "$(readlink -f "$(command -v nvcc)")")"); export CUDA_HOME
fi
unset RANK LOCAL_RANK WORLD_SIZE LOCAL_WORLD_SIZE GROUP_RANK
XS=(); for v in NCCL_NVLS_ENABLE NCCL_DEBUG NCCL_DEBUG_SUBSYS NCCL_SOCKET_NTHREADS NCCL_NSOCKS_PERTHREAD \
  TORCH_SYMM_MEM_DISABLE_MULTICAST \
  NVSHMEM_DISABLE_NVLS PYTHONUNBUFFERED TORCH_CUDA_ARCH_LIST DS_BUILD_OPS \
  DS_ACCELERATOR TORCH_EXTENSIONS_DIR CUDA_HOME PATH LD_LIBRARY_PATH CPATH; do
  [ -n "${!v:-}" ] && XS+=(-x "$v"); done
NG=$(nvidia-smi -L 2> /dev/null | grep -c '^GPU'); [ "$NG" -ge 1 ] || NG=${GPUS:-1}

# ---- which runs --------------------------------------------------------------------------
SYS2="ours_zero3 ours_zeropp fsdp2 ds_zero3 ds_zeropp"
RUNS=() PREP=0 LINKCHECK=0 PORT=29700
while [ $# -gt 0 ]; do
  case $1 in
    prep) PREP=1 ;;
    linkcheck) LINKCHECK=1 ;;
    world1) RUNS+=(world1-1p3b-mb4-ours_zero3 world1-1p3b-mb4-fsdp2 world1-124m-mb8-ours_zero3 world1-124m-mb8-fsdp2)
            [ "$DS1" = 1 ] && RUNS+=(world1-1p3b-mb4-ds_zero3) ;;
    nodes2) mbs=(); while [[ ${2:-} == mb[0-9]* ]]; do mbs+=("${2#mb}"); shift; done
            [ ${#mbs[@]} -gt 0 ] || mbs=(1 4)
            for m in "${mbs[@]}"; do for s in $SYS2; do RUNS+=("nodes2-1p3b-mb$m-$s"); done; done ;;
    world1llmc) RUNS+=(world1-1p3b-mb4-ours_zero3 world1-1p3b-mb4-llmc world1-1p3b-mb4-ours_zero3+acts
                       world1-124m-mb8-ours_zero3+h64 world1-124m-mb8-llmc
                       world1-124m-mb8-ours_zero3+h64+lnacts) ;;
    big) RUNS+=(world1-6p7b-mb1-ours_zero3 world1-6p7b-mb1-fsdp2 world1-6p7b-mb1-llmc) ;;
    fit) ls=(); while [[ ${2:-} == l[0-9]* ]]; do ls+=("${2#l}"); shift; done
         [ ${#ls[@]} -gt 0 ] || ls=(36 40 44 48)
         for l in "${ls[@]}"; do for s in ours_zero3 fsdp2; do
           RUNS+=("world1-w4096l$l-mb1-$s"); done; done ;;
    llama) RUNS+=(world1-llama1b-mb1-ours_zero3 world1-llama1b-mb1-fsdp2) ;;
    llamanodes) mbs=(); while [[ ${2:-} == mb[0-9]* ]]; do mbs+=("${2#mb}"); shift; done
            [ ${#mbs[@]} -gt 0 ] || mbs=(1 2)
            for m in "${mbs[@]}"; do for s in ours_zero3 ours_zeropp fsdp2; do
              RUNS+=("nodes2-llama1b-mb$m-$s"); done; done ;;
    world1-*|nodes2-*) RUNS+=("$1") ;;
    *) sed -n '2,/^set -uo/p' "$0" | sed '$d'; exit 2 ;;
  esac
  shift
done
[ ${#RUNS[@]} -gt 0 ] || [ "$PREP" = 1 ] || [ "$LINKCHECK" = 1 ] ||
  { echo "nothing to run: $0 prep|linkcheck|world1|world1llmc|big|fit [lN]|llama|nodes2 [mbN]|llamanodes [mbN]|RUN..."; exit 2; }
say() { echo "$*" | tee -a "$OUT/race.txt"; }
left() { echo $(( BUDGET - SECONDS )); }
say "$(date -u +%FT%TZ) race: $(nvidia-smi --query-gpu=name --format=csv,noheader 2> /dev/null | head -1) x$NG," \
    "STEPS=$STEPS WARM=$WARM LINK=$LINK SOCKS=$SOCKS call $CALL, runs: ${RUNS[*]:-none}"

# ---- prep: our build (in the background) beside the peers' wheels and JIT op ---------------
build() {
  [ -x build-gpu/zeropp ] && [ -z "${REBUILD:-}" ] && return 0
  if ! [ -f /usr/include/cjson/cJSON.h ]; then  # not installed there: .deps/ carries the .debs
    mkdir -p /tmp/cjson && for f in .deps/*.deb; do dpkg -x "$f" /tmp/cjson; done
    export CJSON_ROOT=/tmp/cjson/usr
  fi
  cmake -S . -B build-gpu -DCMAKE_BUILD_TYPE=Release > "$OUT/build.log" 2>&1 &&
    cmake --build build-gpu -j"$(nproc)" --target zeropp_cli >> "$OUT/build.log" 2>&1
}
DS_OK=0 DS_ZPP_OK=0
peers_setup() { # 1 = also the quantizer op (DeepSpeed ZeRO++ needs it)
  local L=$OUT/peers-setup.log
  if ! [ -f "$SITE/.installed" ]; then
    if ! python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" \
         "$PEERS"/deepspeed/wheels/*.whl >> "$L" 2>&1; then say "peers: wheel install failed"; return 1; fi
    mkdir -p "$SITE" && touch "$SITE/.installed"
  fi
  DS_OK=1
  [ "$1" = 1 ] || return 0
  # torch builds the op against Python.h; ds_peer.sh ships 3.12's for a python without headers
  if ! python3 -c "import sysconfig,os,sys; sys.exit(not os.path.exists(sysconfig.get_path('include')+'/Python.h'))" &&
     [ -f "$PEERS/deepspeed/py312_include.tar.gz" ]; then
    mkdir -p /tmp/py312inc && tar xzf "$PEERS/deepspeed/py312_include.tar.gz" -C /tmp/py312inc
    export CPATH=/tmp/py312inc/python3.12${CPATH:+:$CPATH}; XS+=(-x CPATH)
  fi
  local t=$SECONDS
  PYTHONPATH=$SITE timeout -k 10 "$JIT_TMO" python3 -c "from deepspeed.ops.op_builder import QuantizerBuilder as Q
Q().load(verbose=True); print('QUANTIZER_JIT_OK')" > "$OUT/jit.log" 2>&1
  cat "$OUT/jit.log" >> "$L"
  find "$TORCH_EXTENSIONS_DIR" -name lock -delete 2> /dev/null  # a killed build's lock would stall the ranks
  if grep -q QUANTIZER_JIT_OK "$OUT/jit.log"; then DS_ZPP_OK=1; say "peers: quantizer op ready in $(( SECONDS - t ))s"
  else say "peers: quantizer op build FAILED (see peers-setup.log): DeepSpeed ZeRO++ runs are skipped"; fi
}
need_ours=$PREP need_ds=$PREP need_zpp=$PREP need_llmc=$PREP
for r in "${RUNS[@]}"; do case $r in
  *-ours_*) need_ours=1 ;; *-ds_zeropp*) need_ds=1 need_zpp=1 ;; *-ds_*) need_ds=1 ;;
  *-llmc*) need_llmc=1 ;; esac; done
LLMC_OK=0
llmc_build() { # llm.c's own build (minutes: cuDNN's frontend), once, kept in build-gpu/llmc
  [ -x "$LLMC_BUILD/train_gpt2cu" ] && return 0
  [ -f "$PEERS/llmc/llmc_peer.sh" ] || { say "no .peers/llmc: run bench/train/stage_peers.sh"; return 1; }
  mkdir -p "$(dirname "$LLMC_BUILD")"
  BUILD=$LLMC_BUILD RUNS=" " bash "$PEERS/llmc/llmc_peer.sh" > "$OUT/llmc-build.log" 2>&1
}
BUILD_OK=0
if [ "$DRY" = 1 ]; then
  say "DRY: would build build-gpu (ours=$need_ours, llm.c=$need_llmc), set up the peers" \
      "(ds=$need_ds, quantizer=$need_zpp)"
  BUILD_OK=1 DS_OK=1 DS_ZPP_OK=1 LLMC_OK=1
else
  [ "$need_ours" = 1 ] && { build & bpid=$!; }
  [ "$need_llmc" = 1 ] && { llmc_build & lpid=$!; }
  if [ "$need_ds" = 1 ]; then
    if [ -f "$EMU" ]; then peers_setup "$need_zpp"
    else say "no .peers/: run bench/train/stage_peers.sh where ../shared/bench is, and carry .peers"; fi
  fi
  if [ "$need_ours" = 1 ]; then
    if wait "$bpid"; then BUILD_OK=1; say "build-gpu/zeropp ready at ${SECONDS}s"
    else say "build FAILED:"; tail -20 "$OUT/build.log" | tee -a "$OUT/race.txt"; fi
  fi
  if [ "$need_llmc" = 1 ]; then
    if wait "$lpid"; then LLMC_OK=1; say "llm.c ready at ${SECONDS}s"
    else say "llm.c build FAILED:"; tail -20 "$OUT/llmc-build.log" | tee -a "$OUT/race.txt"; fi
  fi
fi

# ---- the link: capped by traffic control, or the bare sockets -------------------------------
# Made after the build: with labelled addresses on lo (no dummy devices), Open MPI's
# interface scan prints warnings that CMake's FindMPI takes for a broken mpicc.
LINK_DESC=socket
if [ "$LINK" != socket ] && [ "$DRY" != 1 ]; then
  if out=$(bash "$LINKSH" up "$LINK" 2 2>&1); then
    LINK_DESC="htb-$LINK"; say "$out"
    trap 'bash "$LINKSH" down' EXIT
  else
    say "LINK=$LINK refused, so this call runs on the bare sockets (LINK=socket): $out"
  fi
elif [ "$DRY" = 1 ] && [ "$LINK" != socket ]; then LINK_DESC="htb-$LINK"; fi
link_bytes() { # bytes sent so far through the nodes' classes (0 on the bare sockets)
  [ "$LINK_DESC" = socket ] && { echo 0; return; }
  bash "$LINKSH" stats 2> /dev/null |
    awk '/^class htb 1:1[0-9]* / {c = ($3 != "1:1")} c && /^ Sent/ {s += $2; c = 0} END {printf "%.0f", s}'
}
# the per-rank wrapper that puts a rank's NCCL sockets on its node's address
LINK_RANK=(); [ "$LINK_DESC" != socket ] && LINK_RANK=(bash "$LINKSH" rank)

# ---- linkcheck: what the link gives PyTorch's NCCL, with NCCL's socket defaults and with SOCKS --
if [ "$LINKCHECK" = 1 ]; then
  if [ "$DRY" = 1 ]; then say "DRY: would run coll_bw.py on $LINK_DESC with 1x1 and $SOCKS sockets"
  elif ! [ -f "$PEERS/coll_bw.py" ]; then say "linkcheck: no .peers/coll_bw.py (bench/train/stage_peers.sh)"
  else
    for sk in ${LINKCHECK_SOCKS:-1x1 $SOCKS}; do
      lb0=$(link_bytes) t1=$SECONDS
      timeout -k 10 150 env NCCL_SOCKET_NTHREADS="${sk%x*}" NCCL_NSOCKS_PERTHREAD="${sk#*x}" TAG="$LINK_DESC/socks=$sk" \
        GPUS_PER_NODE=1 MASTER_ADDR=127.0.0.1 MASTER_PORT=$(( PORT += 7 )) \
        mpirun --allow-run-as-root --bind-to none --oversubscribe -np 2 "${XS[@]}" -x NCCL_SOCKET_NTHREADS \
        -x NCCL_NSOCKS_PERTHREAD -x TAG -x GPUS_PER_NODE -x MASTER_ADDR -x MASTER_PORT \
        "${LINK_RANK[@]}" bash "$EMU" python3 "$PEERS/coll_bw.py" > "$OUT/linkcheck-$sk.log" 2>&1
      grep '^COLL' "$OUT/linkcheck-$sk.log" | tee -a "$OUT/race.txt"
      say "   ($(( SECONDS - t1 )) s, $(awk -v a="$lb0" -v b="$(link_bytes)" 'BEGIN {printf "%.0f", (b - a) / 1e6}') MB through the cap)"
    done
  fi
fi

# ---- one run ---------------------------------------------------------------------------------
HEADER='setting\tmodel\tmicro_batch\tsystem\tvariant\ttokens_per_s\tpeak_mem_MiB\tsteps\tstatus\twarm\tranks\tgpus\tself_mem_MiB\tmem_src\ttransport\tlink\tsocks\tlink_MB\twall_s\tnote\trun\tcall\tutc\n'
if [ -f "$TSV" ] && [ "$(head -1 "$TSV")" != "$(printf "$HEADER" | head -1)" ]; then
  mv "$TSV" "$TSV.old-format"; say "an older race.tsv (other columns) moved to race.tsv.old-format"
fi
[ -f "$TSV" ] || printf "$HEADER" > "$TSV"
gpu_used() { nvidia-smi --query-gpu=index,memory.used --format=csv,noheader,nounits 2> /dev/null; }
settle() { # wait (up to 30 s) until the last run's memory is gone, so it is not counted in the next
  for _ in $(seq 30); do
    awk -F', *' 'NR==FNR {b[$1]=$2; next} $2 > b[$1] + 512 {busy=1} END {exit busy}' "$OUT/idle.mem" <(gpu_used) && return
    sleep 1
  done
  say "   GPU memory still above its idle level after 30 s"
}
tmo() { local t=$(( $(left) - 10 )); echo $(( t < RUN_TMO ? t : RUN_TMO )); }  # this run's limit
measure() { # CMD...: run it under its limit with nvidia-smi sampling into $m.*; sets rc (run_one's locals)
  mkdir -p "$OUT/mem"; settle; gpu_used > "$m.idle"
  nvidia-smi --query-gpu=index,memory.used --format=csv,noheader,nounits -lms 100 > "$m.gpu" 2> /dev/null & local s1=$!
  nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits -lms 100 > "$m.proc" 2> /dev/null & local s2=$!
  # timeout leads its own process group and signals all of it; what is left of the group goes after
  timeout -k 15 "$(tmo)" "$@" > "$log" 2>&1 < /dev/null & local pid=$!
  wait "$pid"; rc=$?
  kill -KILL -- -"$pid" 2> /dev/null
  kill "$s1" "$s2" 2> /dev/null; wait "$s1" "$s2" 2> /dev/null
}
median() { sort -g | awk '{a[NR]=$1} END {if (NR) print a[int(NR/2)+1]}'; }  # upper middle, as fsdp_gpt.py
run_one() {
  local name=$1 setting model mb sys base D L np rpg envs=() cmd=() script="" status="" tok="" self="" note=""
  IFS=- read -r setting model mb sys <<< "$name"; mb=${mb#mb}
  base=${sys%%+*}; local variant=${sys#"$base"}; variant=${variant#+}; local vs; IFS=+ read -ra vs <<< "$variant"
  local T=1024 cfg=gpt_$model
  case $model in 1p3b) D=2048 L=24 ;; 124m) D=768 L=12 ;; 6p7b) D=4096 L=32 ;;
    w4096l[0-9]*) D=4096 L=${model#w4096l} cfg=gpt_6p7b ;;  # the 6.7B's config at depth L
    llama1b) D=2048 L=16 T=2048 cfg=llama_1b ;;
    *) say "$name: unknown model"; return ;; esac
  case $setting in world1) np=1 ;; nodes2) np=2 ;; *) say "$name: unknown setting"; return ;; esac
  rpg=$(( np > NG ? (np + NG - 1) / NG : 1 ))  # ranks sharing one GPU
  local log=$OUT/$name.log met=$OUT/$name.jsonl v
  PORT=$((PORT + 1))
  case $base in
    ours_zero3|ours_zeropp)
      [ "$BUILD_OK" = 1 ] || status=build_failed
      # the configs are micro-batch 4 (1.31B) or 8 (124M): rewrite it for the others
      local edits=(-e "s/(\"train_micro_batch_size_per_gpu\": *)[0-9]+/\1$mb/"
                   -e "s/(\"n_layer\": *)[0-9]+/\1$L/")
      for v in "${vs[@]}"; do case $v in
        keep) edits+=(-e 's/("stage": *3)/\1, "stage3_max_reuse_distance": 1000000000000/') ;;
        h64) edits+=(-e "s/(\"n_head\": *)[0-9]+/\1$(( D / 64 ))/") ;;
        noresident) edits+=(-e 's/("stage": *3)/\1, "zeropp_resident_weights": false/') ;;
        acts) edits+=(-e 's/("zeropp": *\{)/\1"keep_activations": true, /') ;;
        lnacts) edits+=(-e 's/("zeropp": *\{)/\1"keep_activations": "layernorm", /') ;;
        *) say "$name: unknown variant '$v' of ours"; return ;; esac; done
      sed -E "${edits[@]}" "bench/train/${cfg}_${base#ours_}.json" > "$OUT/$name.json" 2> /dev/null ||
        status=no_config
      cmd=(mpirun --allow-run-as-root --bind-to none --oversubscribe -np "$np" "${XS[@]}" "${LINK_RANK[@]}"
           build-gpu/zeropp train --device gpu --config "$OUT/$name.json" --steps "$STEPS" --quiet --metrics "$met")
      [ "$np" -gt 1 ] && cmd+=(--node-size 1 --emulate-nodes) ;;
    fsdp2|ds_zero3|ds_zeropp)
      script=$PEERS/fsdp_gpt.py
      [ "$model" = llama1b ] && script=$PEERS/fsdp_llama.py  # its defaults are the Llama-3.2-1B shape
      envs=(D="$D" L="$L" B="$mb" T="$T" STEPS="$STEPS" WARM="$WARM" TAG="$name"
            MASTER_ADDR=127.0.0.1 MASTER_PORT="$PORT" GPUS_PER_NODE=1
            OMP_NUM_THREADS=4)  # ds_peer.sh's; ours runs as train_compare.sh does
      if [ "$base" = fsdp2 ]; then
        local raf=1 compile=0
        for v in "${vs[@]}"; do case $v in
          raf0) raf=0 ;; raf1) raf=1 ;; compile) compile=1 ;;
          *) say "$name: unknown variant '$v' of fsdp2"; return ;; esac; done
        envs+=(RAF=$raf COMPILE=$compile)
      else
        script=$PEERS/deepspeed/ds_gpt.py; envs+=(MODE="${base#ds_}" HPZ=1 PYTHONPATH="$SITE")
        [ "$model" = llama1b ] && { say "$name: the DeepSpeed peer trains the GPT only"; return; }
        local extra; read -ra extra <<< "${DS_ENV:-}"; envs+=("${extra[@]}")  # e.g. DS_ENV="LSP=12 PBS=2e8"
        for v in "${vs[@]}"; do case $v in
          rbs[0-9]*) envs+=(RBS="${v#rbs}") ;;
          keep) envs+=(MLP=1e12 MRD=1e12) ;;
          *) say "$name: unknown variant '$v' of DeepSpeed"; return ;; esac; done
        if [ "$DS_OK" != 1 ]; then status=peer_setup_failed
        elif [ "$base" = ds_zeropp ] && [ "$DS_ZPP_OK" != 1 ]; then status=jit_failed; fi
      fi
      [ -f "$script" ] && [ -f "$EMU" ] || status=no_peer_copy
      # emu_rank.sh puts each rank on its own emulated node (NCCL_HOSTID) and GPU (rank % GPUs)
      local xs=("${XS[@]}"); for e in "${envs[@]}"; do xs+=(-x "${e%%=*}"); done
      cmd=(env "${envs[@]}" mpirun --allow-run-as-root --bind-to none --oversubscribe -np "$np" "${xs[@]}"
           "${LINK_RANK[@]}" bash "$EMU" python3 "$script") ;;
    llmc)
      [ "$np" = 1 ] || { say "$name: llm.c runs at world1 only"; return; }
      [ "$LLMC_OK" = 1 ] || status=build_failed
      local lm  # llm.c's descriptors of these shapes (its GPT-3 table: heads of 128 at 1.3B and 6.7B)
      case $model in 124m) lm=d12 ;; 1p3b) lm=gpt3:c2048 ;; 6p7b) lm=gpt3:c4096 ;;
        *) say "$name: llm.c has no descriptor for $model"; return ;; esac
      cmd=(env BUILD="$LLMC_BUILD" RUNS="$lm:$mb" STEPS="$STEPS" WARM="$WARM" bash "$PEERS/llmc/llmc_peer.sh") ;;
    *) say "$name: unknown system"; return ;;
  esac
  local t1=$SECONDS rc=0 mem="" src="" net="" m=$OUT/mem/$name lb0 lmb=""
  [ -z "$status" ] && [ "$(tmo)" -lt "$MIN_RUN" ] && status=skipped_budget
  if [ "$DRY" = 1 ]; then
    say "DRY $name (timeout $(tmo)s): $(printf '%q ' "${cmd[@]}")"; status=${status:-dry}
  elif [ -z "$status" ]; then
    lb0=$(link_bytes)
    measure "${cmd[@]}"
    # as ds_peer.sh does: a peer that died at start under mpirun gets one more go under torchrun
    if [[ $sys != ours_* ]] && [ "$base" != llmc ] && [ "$rc" != 0 ] && [ $(( SECONDS - t1 )) -lt 60 ] && [ "$(tmo)" -ge "$MIN_RUN" ] &&
       command -v torchrun > /dev/null &&
       ! grep -qE '^(FSDP2|DS mode=)' "$log"; then
      say "   mpirun: died at start (rc=$rc), again under torchrun"; mv "$log" "$log.mpirun"
      measure env "${envs[@]}" torchrun --standalone --nproc-per-node "$np" --no-python "${LINK_RANK[@]}" bash "$EMU" python3 "$script"
      note="torchrun"
    fi
    [ "$np" -gt 1 ] && lmb=$(awk -v a="$lb0" -v b="$(link_bytes)" 'BEGIN {printf "%.0f", (b - a) / 1e6}')
    case $base in
      ours_*) [ "$rc" = 0 ] && tok=$(sed -n 's/.*"step":\([0-9]*\),.*"tokens_per_s":\([0-9.]*\).*/\1 \2/p' "$met" |
                                     awk -v w="$WARM" '$1 > w {print $2}' | median)
              self=$(sed -n 's/.*"device_peak_bytes":\([0-9]*\).*/\1/p' "$met" 2> /dev/null | sort -g | tail -1)
              [ -n "$self" ] && self=$(( self / 1048576 ))
              # the GPU's memory in use (driver) beyond ours after a step: context, libraries,
              # NCCL (and the other rank's process when two share the GPU)
              outside=$(sed -n 's/.*"device_live_bytes":\([0-9]*\),"device_used_bytes":\([0-9]*\).*/\1 \2/p' "$met" |
                        awk '{d = ($2 - $1) / 1048576; if (d > m) m = d} END {if (m) printf "%.0f", m}')
              note="skipped=$(grep -c '"skipped":true' "$met" 2> /dev/null)${outside:+ used-ours=${outside}MiB}" ;;
      llmc) tok=$(sed -n 's/^llmc .* tok_s=\([0-9.]*\).*/\1/p' "$log" | tail -1) ;;
      *) local line; line=$(grep -E '^(FSDP2|DS mode=)' "$log" | tail -1)
         tok=$(sed -n 's/.* tok_s=\([0-9.]*\).*/\1/p' <<< "$line")
         self=$(sed -n 's/.* mem_GiB=\([0-9.]*\).*/\1/p' <<< "$line" | awk '{printf "%.0f", $1 * 1024}')
         # DeepSpeed: fp16 overflow steps skip the update (and are faster); is qgZ really on (DS-INFO)?
         note="$(printf '%s\n' "$(grep -E '^DS-INFO' "$log" | tail -1)" "$line" |
                 grep -oE '(qwZ|qgZ|loss|skipped|loss_scale)=[^ ]+' | paste -sd' ')${note:+ $note}" ;;
    esac
    if [ -n "$tok" ]; then status=ok; elif [ "$rc" = 124 ] || [ "$rc" = 137 ]; then status=timeout; else status=failed; fi
    [ "$rc" != 0 ] && note="${note:+$note }rc=$rc"
    # per rank: the biggest process if the driver lists them, else the GPU's growth / ranks on it
    mem=$(awk -F', *' '$2 ~ /^[0-9]+$/ && $2 > m {m = $2} END {if (m) print m}' "$m.proc")
    if [ -n "$mem" ]; then src=proc; else src=gpu
      mem=$(awk -F', *' -v r="$rpg" 'NR==FNR {b[$1]=$2; next} ($2-b[$1])/r > m {m=($2-b[$1])/r} END {printf "%.0f", m}' \
            "$m.idle" "$m.gpu"); fi
    net=$(grep -oE 'via (NET/[A-Za-z]+|P2P/[A-Za-z]+|SHM)' "$log" | sort -u | sed 's/via //' | paste -sd,)
    [ "$status" = ok ] || tail -4 "$log" | sed 's/^/   /' | tee -a "$OUT/race.txt"
  fi
  say "$(printf '%-40s %-14s %10s tok/s %8s MiB/rank (%s) %6s MB on the link, %4ss  %s' "$name" "$status" "${tok:--}" \
        "${mem:--}" "${src:--}" "${lmb:--}" "$(( SECONDS - t1 ))" "$note")"
  printf '%s\t' "$setting" "$model" "$mb" "$base" "${variant:--}" "$tok" "$mem" "$STEPS" "$status" "$WARM" "$np" \
    "$(( np < NG ? np : NG ))" "$self" "$src" "${net:--}" "$([ "$np" -gt 1 ] && echo "$LINK_DESC" || echo -)" \
    "$SOCKS" "$lmb" "$(( SECONDS - t1 ))" "$note" "$name" "$CALL" >> "$TSV"
  date -u +%FT%TZ >> "$TSV"
}

[ "$DRY" = 1 ] || gpu_used > "$OUT/idle.mem"
for r in "${RUNS[@]}"; do run_one "$r"; done
say "done in ${SECONDS}s; $TSV"
if [ "${PACK:-1}" = 1 ] && [ "$DRY" != 1 ]; then  # only what this script wrote
  [ "$LINK_DESC" != socket ] && bash "$LINKSH" stats > "$OUT/link-stats.txt" 2>&1
  packed=(); for f in build.log peers-setup.log jit.log idle.mem mem link-stats.txt linkcheck-1x1.log "linkcheck-$SOCKS.log"; do [ -e "$OUT/$f" ] && packed+=("$f"); done
  for r in "${RUNS[@]}"; do for f in "$OUT/$r".*; do [ -e "$f" ] && packed+=("${f##*/}"); done; done
  [ ${#packed[@]} -eq 0 ] || tar czf "$OUT/race-logs-$(date -u +%Y%m%dT%H%M%S).tgz" -C "$OUT" --remove-files "${packed[@]}" ||
    say "could not pack the logs; they stay in $OUT"
fi
