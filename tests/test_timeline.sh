#!/usr/bin/env bash
# bench/gpu/trace/timeline.c on a made-up trace whose answer is known by
# construction: steps of kernels separated by random gaps (none, under the
# 5 us line, at it, or up to 0.5 ms), some opened by a launch that returned only
# after the gap began (the device waited for the host, sometimes while the
# host sat in a synchronize), some kernels overlapped by a second stream's
# kernel that runs past them (the gap after shrinks by that much), launches
# recorded as a runtime call and the driver call inside it (which may
# return before the gap begins), and short kernels of a second
# stream inside longer ones, which change nothing. The totals of its "steady"
# line must equal the ones counted while the trace was made, the host's
# synchronize must be named, and a regex that matches nothing, a missing
# file and a malformed line must each exit 2.
# Usage: tests/test_timeline.sh ZPP_TIMELINE
set -euo pipefail
tool=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
seed=${SEED:-$RANDOM}
steps=6 skip=2

awk -v seed="$seed" -v S="$steps" -v skip="$skip" -v trace="$tmp/trace.tsv" '
function kernel(start, dur, stream, name) {
  print "K\t" start "\t" start + dur "\t" stream "\t" ++corr "\t" name > trace
  nk++; ks[nk] = start; kd[nk] = dur
}
BEGIN {
  srand(seed); busy = 1000000; corr = 0; nk = 0
  for (s = 0; s <= S; s++) {
    J = s == S ? 1 : 5 + int(rand() * 8)
    for (j = 0; j < J; j++) {
      r = rand()
      g = (s == 0 && j == 0) || r < 0.3 ? 0 : r < 0.5 ? 1 + int(rand() * 4000) : \
          r < 0.65 ? 4999 + int(rand() * 3) : 5000 + int(rand() * 500000)
      start = busy + g; dur = 1000 + int(rand() * 200000)
      host = g >= 3 && rand() < 0.5
      if (j == 0) B[s] = start
      kernel(start, dur, 7, j == 0 ? "embed_forward_kernel" : "gemm_" int(rand() * 3))
      gap[nk] = g; hostgap[nk] = host
      if (host) {          # the launch returned inside the gap, its driver call before
        ls = busy - 200; le = busy + int(2 * g / 3) + 1
        if (rand() < 0.5) { # ... after a synchronize that began before it
          print "R\t" busy - 500 "\t" busy + int(g / 3) "\t1\t" corr + 1000000 "\tcudaStreamSynchronize" > trace
        }
      } else {             # the launch was queued before the device went idle
        le = busy - 1000; ls = le - 2000 - int(rand() * 5000)
      }
      print "R\t" ls "\t" le "\t1\t" corr "\tcudaLaunchKernel" > trace
      print "D\t" ls + 50 "\t" ls + 100 "\t1\t" corr "\tcuLaunchKernel" > trace
      busy = start + dur
      if (rand() < 0.3) {          # a short kernel inside this one changes nothing
        kernel(start + int(dur / 4), int(dur / 4), 9, "nested_kernel")
        print "R\t" start - 50 "\t" start - 20 "\t1\t" corr "\tcudaLaunchKernel" > trace
        gap[nk] = 0; hostgap[nk] = 0
      }
      if (s < S && rand() < 0.3) { # a second stream runs past this kernel
        s2 = start + int(dur / 2); ext = 1 + int(rand() * 3000)
        kernel(s2, busy + ext - s2, 9, "other_stream_kernel")
        print "R\t" s2 - 100 "\t" s2 - 50 "\t1\t" corr "\tcudaLaunchKernel" > trace
        gap[nk] = 0; hostgap[nk] = 0
        busy += ext
      }
    }
  }
  # steady steps: [B[skip], B[S]); the gap before a kernel belongs to the step it
  # ends, so the gaps of kernels starting in (B[skip], B[S]]
  for (i = 1; i <= nk; i++) {
    if (ks[i] > B[skip] && ks[i] <= B[S] && gap[i] > 0) {
      idle += gap[i]; gaps++
      if (gap[i] < 5000) small += gap[i]
      if (hostgap[i]) hidle += gap[i]
    }
    if (ks[i] >= B[skip] && ks[i] < B[S]) { kern++; kns += kd[i] }
  }
  printf "steady\tsteps=%d\twall_ns=%d\tidle_ns=%d\thost_idle_ns=%d\tsmall_idle_ns=%d\tgaps=%d\tkernels=%d\tkernel_ns=%d\n", \
    S - skip, B[S] - B[skip], idle, hidle, small, gaps, kern, kns
}' > "$tmp/want"
# the trace is written in no particular order (a tracer's buffers need not be)
shuf "$tmp/trace.tsv" -o "$tmp/trace.tsv" --random-source=<(yes "$seed")

"$tool" "$tmp/trace.tsv" '^embed_forward' "$skip" 5 1000 > "$tmp/out" ||
  { echo "FAIL: zpp_timeline exited $? (seed $seed)"; exit 1; }
want=$(cat "$tmp/want") got=$(grep '^steady' "$tmp/out" || true)
[ "$got" = "$want" ] ||
  { printf 'FAIL (seed %s):\n got  %s\n want %s\n' "$seed" "$got" "$want"; cat "$tmp/out"; exit 1; }
# a second trace, the same step six times: 10 us kernels with a 300 us gap
# the host spent in a synchronize before launching, a 20 us gap of the
# device's own, a 50 us gap the host spent in its own code and in the
# launch (which is no cause), and a 2 us one; the median step lists them by
# length
: > "$tmp/fixed.tsv"
for s in 0 1 2 3 4 5; do
  t=$((1000000 + s * 412000)) c=$((s * 10))
  k() { printf 'K\t%d\t%d\t7\t%d\t%s\n' $((t + $1)) $((t + $1 + 10000)) $((c + $2)) "$3"; }
  r() { printf 'R\t%d\t%d\t1\t%d\t%s\n' $((t + $1)) $((t + $2)) $((c + $3)) "$4"; }
  k 0 1 embed_forward_kernel; r -5000 -4000 1 cudaLaunchKernel
  r 9000 300000 2 cudaStreamSynchronize
  k 310000 3 gemm_A; r 300500 301000 3 cudaLaunchKernel
  k 340000 4 gemm_B; r 302000 303000 4 cudaLaunchKernel
  k 400000 5 gemm_C; r 360000 390000 5 cudaLaunchKernel
done >> "$tmp/fixed.tsv"
"$tool" "$tmp/fixed.tsv" '^embed' 1 5 4 > "$tmp/fixed.out" || { echo "FAIL: fixed trace"; exit 1; }
gaps=$(sed -n '/^Largest gaps/,/^Kernels/p' "$tmp/fixed.out" | sed '1d;$d' | awk '{$1 = $1; print}')
want_gaps='300.0 host embed_forward_kernel -> gemm_A [host in cudaStreamSynchronize]
50.0 host gemm_B -> gemm_C [host code]
20.0 device gemm_A -> gemm_B
2.0 device gemm_C -> embed_forward_kernel'
[ "$gaps" = "$want_gaps" ] ||
  { printf 'FAIL: the fixed trace'"'"'s gaps:\n%s\nwant:\n%s\n' "$gaps" "$want_gaps"; exit 1; }

for bad in "nothing_matches" ; do
  if "$tool" "$tmp/trace.tsv" "$bad" > /dev/null 2> "$tmp/err"; then
    echo "FAIL: a regex matching no kernel passed"; exit 1
  fi
  grep -q 'need at least' "$tmp/err" || { echo "FAIL: unclear message: $(cat "$tmp/err")"; exit 1; }
done
printf 'K\t1\t2\t7\n' > "$tmp/short.tsv"
"$tool" "$tmp/short.tsv" x > /dev/null 2>&1 && { echo "FAIL: a malformed line passed"; exit 1; }
"$tool" "$tmp/none.tsv" x > /dev/null 2>&1 && { echo "FAIL: a missing file passed"; exit 1; }
echo "ok (seed $seed): $got"
