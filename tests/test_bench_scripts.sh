#!/usr/bin/env bash
# The benchmark scripts parse (bash -n, every *.sh under bench/, scripts/ and
# .ci/), and bench/train/report.sh, which judges the race's ratios against
# their targets, computes them from a race.tsv: made-up runs with a random
# pair of speeds, the ratio read back against the one computed here, and a
# target met or missed as the ratio says. (A quote in report.sh's awk program
# once broke it without any run noticing.)
# Usage: tests/test_bench_scripts.sh SOURCE_DIR
set -euo pipefail
src=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
n=0
while IFS= read -r f; do
  bash -n "$f" || { echo "FAIL: $f does not parse"; exit 1; }
  n=$((n + 1))
done < <(find "$src/bench" "$src/scripts" "$src/.ci" -name '*.sh' -o -name run -path '*/.ci/*')
[ "$n" -gt 5 ] || { echo "FAIL: found only $n scripts"; exit 1; }

# a race.tsv of one call: the Llama at world 1, ours against FSDP2
ours=$(( 20000 + RANDOM % 30000 )) fsdp=$(( 10000 + RANDOM % 30000 ))
hdr='setting\tmodel\tmicro_batch\tsystem\tvariant\ttokens_per_s\tpeak_mem_MiB\tsteps\tstatus\twarm\tranks\tgpus\tself_mem_MiB\tmem_src\ttransport\tlink\tsocks\tlink_MB\twall_s\tnote\trun\tcall\tutc\n'
row() { printf 'world1\tllama1b\t1\t%s\t-\t%s\t1000\t8\tok\t3\t1\t1\t1\tproc\t-\t-\t4x4\t\t5\t\t%s\tC1\t2026-01-01T00:00:00Z\n' "$1" "$2" "world1-llama1b-mb1-$1"; }
{ printf "$hdr"; row ours_zero3 "$ours"; row fsdp2 "$fsdp"; } > "$tmp/race.tsv"
out=$(cd "$tmp" && PNG="$tmp/race.png" bash "$src/bench/train/report.sh" "$tmp/race.tsv" 2>&1) ||
  { echo "FAIL: report.sh exited non-zero:"; echo "$out"; exit 1; }
line=$(grep -F '| `C1` |' <<< "$out" | grep -F 'Llama 1B, mb 1: ours ZeRO-3 / FSDP2' || true)
[ -n "$line" ] || { echo "FAIL: no Llama check in:"; echo "$out"; exit 1; }
want=$(awk -v a="$ours" -v b="$fsdp" 'BEGIN {printf "%.2f", a / b}')
got=$(sed -n 's/.*| \([0-9.]*\)× |.*/\1/p' <<< "$line")
[ "$got" = "$want" ] || { echo "FAIL: ratio $got, want $want: $line"; exit 1; }
met=$(awk -v a="$ours" -v b="$fsdp" 'BEGIN {print (a / b >= 1.3) ? "yes" : "no"}')
grep -q "| \*\*$met\*\* |\|| $met |" <<< "$line" || { echo "FAIL: met should be $met: $line"; exit 1; }
echo "ok: $n scripts parse; report.sh: $ours / $fsdp = $got (met: $met)"
