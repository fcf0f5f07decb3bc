#!/usr/bin/env bash
# The race's report, on the development machine once the TSVs of
# bench/train/race.sh have come back:  bash bench/train/report.sh TSV...
# Merges them (a run measured twice: its last `ok` line, else its last line),
# prints markdown: every run, then each acceptance ratio against its target,
# and draws the ratios to FSDP2 as a bar chart, PNG=bench/race.png by default
# (needs gnuplot: apt-get install gnuplot-nox; without it only the chart is missing).
# Memory is peak_mem_MiB: nvidia-smi's, one rank's (see race.sh), the same
# measure for every system; each system's own figure is in the first table.
set -uo pipefail
[ $# -ge 1 ] || { echo "usage: $0 race.tsv..."; exit 2; }
PNG=${PNG:-$(cd "$(dirname "$0")/.." && pwd)/race.png}
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT

awk -F'\t' -v dir="$tmp" '
FNR == 1 && $1 == "setting" { for (i = 1; i <= NF; i++) c[$i] = i; next }
{ k = $c["setting"] "|" $c["model"] "|" $c["micro_batch"] "|" $c["system"]
  if ((k in st) && st[k] == "ok" && $c["status"] != "ok") next  # keep the last ok line
  st[k] = $c["status"]; tok[k] = $c["tokens_per_s"]; mem[k] = $c["peak_mem_MiB"]
  own[k] = $c["self_mem_MiB"]; src[k] = $c["mem_src"]; gpus[k] = $c["gpus"]; note[k] = $c["note"] }
function ok(k) { return (k in st) && st[k] == "ok" && tok[k] > 0 }
function ratio(a, b, f) {  # f: "tok" or "mem"; "" when either is missing
  if (!ok(a) || !ok(b)) return ""
  return f == "tok" ? tok[a] / tok[b] : (mem[b] > 0 ? mem[a] / mem[b] : "") }
function check(label, a, b, f, op, target,   r, met) {
  r = ratio(a, b, f)
  met = r == "" ? "no data" : (op == ">=" ? r >= target : r <= target) ? "**yes**" : "no"
  s = sprintf("%.2f", r); if (r != "" && (s + 0 == target) != (r == target)) s = sprintf("%.4f", r)  # no 1.00× that misses 1.0
  printf "| %s | %s | %s %.1f× | %s |\n", label, r == "" ? "—" : s "×", op == ">=" ? "≥" : "≤", target, met }
BEGIN {
  ns = split("ours_zero3 ours_zeropp fsdp2 ds_zero3 ds_zeropp", S, " ")
  name["ours_zero3"] = "ours ZeRO-3"; name["ours_zeropp"] = "ours ZeRO++"; name["fsdp2"] = "FSDP2"
  name["ds_zero3"] = "DeepSpeed ZeRO-3"; name["ds_zeropp"] = "DeepSpeed ZeRO++"
  nc = split("world1|1p3b|4 world1|124m|8 nodes2|1p3b|1 nodes2|1p3b|4", C, " ")
  cname["world1|1p3b|4"] = "1 GPU, GPT 1.31B, mb 4"; cname["world1|124m|8"] = "1 GPU, GPT-2 124M, mb 8"
  cname["nodes2|1p3b|1"] = "2 emulated nodes, GPT 1.31B, mb 1"; cname["nodes2|1p3b|4"] = "2 emulated nodes, GPT 1.31B, mb 4"
  short["world1|1p3b|4"] = "1 GPU, 1.31B, mb 4"; short["world1|124m|8"] = "1 GPU, 124M, mb 8"
  short["nodes2|1p3b|1"] = "2 nodes, 1.31B, mb 1"; short["nodes2|1p3b|4"] = "2 nodes, 1.31B, mb 4"
}
END {
  print "### Runs\n"
  print "| setting | system | tokens/s | peak MiB a rank | its own peak MiB | GPUs | status | note |"
  print "|---|---|---:|---:|---:|---:|---|---|"
  for (i = 1; i <= nc; i++) for (j = 1; j <= ns; j++) {
    k = C[i] "|" S[j]; if (!(k in st)) continue
    printf "| %s | %s | %s | %s | %s | %s | %s | %s |\n", cname[C[i]], name[S[j]],
      tok[k] == "" ? "—" : sprintf("%.0f", tok[k]), mem[k] == "" ? "—" : mem[k] " (" src[k] ")",
      own[k] == "" ? "—" : own[k], gpus[k], st[k], note[k] }
  print "\n### Acceptance\n"
  print "| check | measured | target | met |"
  print "|---|---:|---:|---|"
  w = "world1|1p3b|4|"; check("1 GPU, 1.31B mb 4: ours / FSDP2 tokens/s", w "ours_zero3", w "fsdp2", "tok", ">=", 1.0)
  w = "world1|124m|8|"; check("1 GPU, 124M mb 8: ours / FSDP2 tokens/s", w "ours_zero3", w "fsdp2", "tok", ">=", 1.1)
  for (mb = 1; mb <= 4; mb += 3) {
    n = "nodes2|1p3b|" mb "|"; l = "2 nodes, 1.31B mb " mb ": "
    check(l "ours ZeRO++ / FSDP2", n "ours_zeropp", n "fsdp2", "tok", ">=", 2.0)
    check(l "ours ZeRO++ / DeepSpeed ZeRO++", n "ours_zeropp", n "ds_zeropp", "tok", ">=", 1.8)
    check(l "ours ZeRO++ / ours ZeRO-3", n "ours_zeropp", n "ours_zero3", "tok", ">=", 2.0)
    check(l "ours ZeRO-3 / FSDP2", n "ours_zero3", n "fsdp2", "tok", ">=", 1.0)
  }
  for (i = 1; i <= nc; i++) for (j = 1; j <= 2; j++) {
    k = C[i] "|" S[j]; if (!(k in st)) continue
    check(short[C[i]] ": peak memory a rank, " name[S[j]] " / FSDP2", k, C[i] "|fsdp2", "mem", "<=", 1.0) }
  # the chart: one cluster a setting, one bar a system, each divided by FSDP2 there
  for (f = 1; f <= 2; f++) {
    out = dir "/" (f == 1 ? "tok" : "mem") ".dat"; printf "setting x" > out
    for (j = 1; j <= ns; j++) printf " \"%s\"", name[S[j]] > out
    print "" > out
    for (i = 1; i <= nc; i++) {
      printf "\"%s\" %d", short[C[i]], i - 1 > out
      for (j = 1; j <= ns; j++) { r = ratio(C[i] "|" S[j], C[i] "|fsdp2", f == 1 ? "tok" : "mem"); printf " %s", r == "" ? "?" : r > out }
      print "" > out }
  }
}' "$@" || exit 1

command -v gnuplot > /dev/null || { echo; echo "no gnuplot here: no chart (apt-get install gnuplot-nox)"; exit 0; }
gnuplot 2> "$tmp/gp.err" <<EOF || { echo "gnuplot failed:"; cat "$tmp/gp.err"; exit 1; }
set terminal pngcairo size 1200,900 font ",11"
set output "$PNG"
set datafile missing "?"
set style data histograms
set style histogram clustered gap 1
set style fill solid 0.85 border -1
set boxwidth 0.95
set grid ytics
set yrange [0:*]
set offsets 0, 0, graph 0.08, 0
set xrange [-0.6:3.6]
set multiplot layout 2,1
set title "zeropp against PyTorch FSDP2 and DeepSpeed: each bar divided by FSDP2 in the same setting" font ",12"
set key outside top center horizontal width 2 samplen 2
set ylabel "tokens/s ÷ FSDP2's"
# bars in a cluster of 5 with a gap of 1 sit 1/6 apart around the cluster's x (column 2)
plot for [c=3:7] "$tmp/tok.dat" using c:xtic(1) title columnheader(c), \
     for [c=3:7] "" using (\$2 + (c - 5) / 6.0):c:(sprintf("%.2f", column(c))) with labels offset 0,0.7 font ",8" notitle, \
     1 with lines dt 2 lc "black" notitle
unset key; unset title
set ylabel "peak memory a rank ÷ FSDP2's"
plot for [c=3:7] "$tmp/mem.dat" using c:xtic(1) title columnheader(c), \
     for [c=3:7] "" using (\$2 + (c - 5) / 6.0):c:(sprintf("%.2f", column(c))) with labels offset 0,0.7 font ",8" notitle, \
     1 with lines dt 2 lc "black" notitle
unset multiplot
EOF
echo; echo "chart: $PNG"
