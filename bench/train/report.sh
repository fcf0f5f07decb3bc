#!/usr/bin/env bash
# The race's report, on the development machine once the TSVs of
# bench/train/race.sh have come back:  bash bench/train/report.sh TSV...
#
# Ratios are formed inside one call only (the `call` column: one invocation
# of race.sh on one machine), never between runs of different calls, which
# met other machines and other days (FSDP2 alone moved 28-43k tokens/s
# across calls). Within a call each system is taken at the fastest variant
# it ran (race.sh's VARIANTs: FSDP2 with or without resharding after the
# forward, compiled or eager; DeepSpeed's bucket sizes; ...), and the report
# names it. Across calls it gives each ratio's range, min-max, with the
# calls named, and says whether the target held in every call. A call may
# hold only one link setting; a run named twice in one call is refused
# (the report will not pick between them).
#
# Prints markdown: the runs of every call, each call's ratios, then the
# ranges. Draws the ratios to the fastest FSDP2 as a bar chart with the
# range across calls, PNG=bench/race.png by default (gnuplot; without it
# only the chart is missing). Only calls on one link go into the chart:
# CHART_LINK (default: the link of the last call given).
set -uo pipefail
[ $# -ge 1 ] || { echo "usage: $0 race.tsv..."; exit 2; }
PNG=${PNG:-$(cd "$(dirname "$0")/.." && pwd)/race.png}
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT

awk -F'\t' -v dir="$tmp" -v chart_link="${CHART_LINK:-}" '
function fail(msg) { print "report.sh: " msg > "/dev/stderr"; bad = 1; exit 1 }
FNR == 1 {
  if ($1 != "setting") fail(FILENAME ": no header line")
  delete c; for (i = 1; i <= NF; i++) c[$i] = i
  if (!("call" in c) || !("variant" in c))
    fail(FILENAME ": made by an older race.sh (no call or variant column); its runs cannot be paired by call")
  next
}
{
  call = $c["call"]; set = $c["setting"] "|" $c["model"] "|" $c["micro_batch"]
  sys = $c["system"]; var = $c["variant"]; if (var == "") var = "-"
  k = call "|" set "|" sys "|" var
  if (k in seen) fail("run " $c["run"] " appears twice in call " call " (" seen[k] " and " FILENAME "): keep one")
  seen[k] = FILENAME
  if (!(call in ncall)) { ncall[call] = 1; calls[++nc] = call }
  if ($c["link"] != "-" && $c["link"] != "") {
    if ((call in link) && link[call] != $c["link"]) fail("call " call " holds two links: " link[call] " and " $c["link"])
    link[call] = $c["link"]
  }
  n = ++nrun[call]; R[call, n] = k
  st[k] = $c["status"]; tok[k] = $c["tokens_per_s"]; mem[k] = $c["peak_mem_MiB"]
  lmb[k] = $c["link_MB"]; note[k] = $c["note"]; socks[call] = $c["socks"]
  if (st[k] == "ok" && tok[k] > 0 && tok[k] > best[call, set, sys]) { best[call, set, sys] = tok[k]; bvar[call, set, sys] = var }
}
function b(call, set, sys) { return ((call, set, sys) in best) ? best[call, set, sys] : 0 }
function lnk(call) { return (call in link) ? link[call] : "-" }
function tgt(t) { return t == 0 ? "—" : sprintf("≥ %g×", t) }
BEGIN {
  name["ours_zero3"] = "ours ZeRO-3"; name["ours_zeropp"] = "ours ZeRO++"; name["fsdp2"] = "FSDP2"
  name["ds_zero3"] = "DeepSpeed ZeRO-3"; name["ds_zeropp"] = "DeepSpeed ZeRO++"; name["llmc"] = "llm.c"
  ns = split("ours_zeropp ours_zero3 fsdp2 ds_zeropp ds_zero3", S, " ")
  sname["world1|1p3b|4"] = "1 GPU, GPT 1.31B, mb 4"; sname["world1|124m|8"] = "1 GPU, GPT-2 124M, mb 8"
  sname["nodes2|1p3b|1"] = "2 nodes, GPT 1.31B, mb 1"; sname["nodes2|1p3b|4"] = "2 nodes, GPT 1.31B, mb 4"
  # the checks: setting, numerator, denominator, target (0: reported, no target)
  nk = 0
  nk++; K[nk] = "nodes2|1p3b|1 ours_zeropp fsdp2 1.6";     nk++; K[nk] = "nodes2|1p3b|1 ours_zeropp ds_zeropp 1.5"
  nk++; K[nk] = "nodes2|1p3b|1 ours_zeropp ours_zero3 1.8"; nk++; K[nk] = "nodes2|1p3b|1 ours_zero3 fsdp2 0"
  nk++; K[nk] = "nodes2|1p3b|4 ours_zeropp fsdp2 1.6";     nk++; K[nk] = "nodes2|1p3b|4 ours_zeropp ds_zeropp 1.5"
  nk++; K[nk] = "nodes2|1p3b|4 ours_zeropp ours_zero3 1.8"; nk++; K[nk] = "nodes2|1p3b|4 ours_zero3 fsdp2 0"
  nk++; K[nk] = "world1|1p3b|4 ours_zero3 fsdp2 1.0";      nk++; K[nk] = "world1|124m|8 ours_zero3 fsdp2 1.1"
  # against llm.c (issue 30); at 124M ours on the heads of 64 that llm.c has (the h64
  # variant of race.sh: the variant column says which of ours ran fastest in the call).
  # No apostrophes in this awk program: it is one single-quoted shell word.
  nk++; K[nk] = "world1|1p3b|4 ours_zero3 llmc 1.05";      nk++; K[nk] = "world1|124m|8 ours_zero3 llmc 1.05"
  # the Llama-3.2-1B shape against FSDP2 (issue 31)
  sname["world1|llama1b|1"] = "1 GPU, Llama 1B, mb 1"
  sname["nodes2|llama1b|1"] = "2 nodes, Llama 1B, mb 1"; sname["nodes2|llama1b|2"] = "2 nodes, Llama 1B, mb 2"
  nk++; K[nk] = "world1|llama1b|1 ours_zero3 fsdp2 1.3"
  nk++; K[nk] = "nodes2|llama1b|1 ours_zeropp fsdp2 2.0";  nk++; K[nk] = "nodes2|llama1b|2 ours_zeropp fsdp2 2.0"
  sname["world1|6p7b|1"] = "1 GPU, GPT 6.7B, mb 1"
  nk++; K[nk] = "world1|6p7b|1 ours_zero3 fsdp2 1.1"
}
END {
  if (bad) exit 1
  print "### Runs\n"
  for (i = 1; i <= nc; i++) {
    call = calls[i]
    printf "Call `%s`, link %s, NCCL sockets %s (threads x sockets a thread):\n\n", call, lnk(call), socks[call]
    print "| setting | system | variant | tokens/s | peak MiB a rank | MB on the link | status | note |"
    print "|---|---|---|---:|---:|---:|---|---|"
    for (j = 1; j <= nrun[call]; j++) {
      k = R[call, j]; split(k, f, "|"); set = f[2] "|" f[3] "|" f[4]
      printf "| %s | %s | %s | %s | %s | %s | %s | %s |\n", (set in sname) ? sname[set] : set, name[f[5]], f[6],
        tok[k] == "" ? "—" : sprintf("%.0f", tok[k]), mem[k] == "" ? "—" : mem[k], lmb[k] == "" ? "—" : lmb[k], st[k], note[k]
    }
    print ""
  }
  print "### Each call: every system at its fastest variant\n"
  print "| call | link | check | ratio | variants (numerator / denominator) | target | met |"
  print "|---|---|---|---:|---|---:|---|"
  for (i = 1; i <= nc; i++) for (q = 1; q <= nk; q++) {
    call = calls[i]; split(K[q], f, " "); set = f[1]; x = b(call, set, f[2]); y = b(call, set, f[3])
    if (!x || !y) continue
    r = x / y; L = (set ~ /^nodes2/) ? lnk(call) : "-"
    lab = sname[set] ": " name[f[2]] " / " name[f[3]]
    printf "| `%s` | %s | %s | %.2f× | %s / %s | %s | %s |\n", call, L, lab, r, bvar[call, set, f[2]],
      bvar[call, set, f[3]], tgt(f[4]), (f[4] == 0 ? "—" : r >= f[4] ? "**yes**" : "no")
    key = L SUBSEP q
    if (!(key in cnt)) { lo[key] = r; hi[key] = r; order[++no] = key }
    if (r < lo[key]) lo[key] = r
    if (r > hi[key]) hi[key] = r
    cnt[key]++; which[key] = which[key] (which[key] == "" ? "" : ", ") "`" call "`"
  }
  # the chart: each system over the fastest FSDP2 of its call, lowest and highest call
  for (i = 1; i <= nc; i++) for (set in sname) for (s = 1; s <= ns; s++) {
    call = calls[i]; z = b(call, set, S[s]); w = b(call, set, "fsdp2"); if (!z || !w) continue
    cz = lnk(call) SUBSEP set SUBSEP s; v = z / w
    if (!(cz in clo) || v < clo[cz]) clo[cz] = v
    if (!(cz in chi) || v > chi[cz]) chi[cz] = v
  }
  print "\n### Ranges across calls\n"
  print "| link | check | min–max | calls | target | met in every call |"
  print "|---|---|---:|---|---:|---|"
  for (o = 1; o <= no; o++) {
    key = order[o]; split(key, g, SUBSEP); split(K[g[2]], f, " ")
    printf "| %s | %s: %s / %s | %.2f–%.2f× | %d: %s | %s | %s |\n", g[1], sname[f[1]], name[f[2]], name[f[3]],
      lo[key], hi[key], cnt[key], which[key], tgt(f[4]),
      (f[4] == 0 ? "—" : lo[key] >= f[4] ? "**yes**" : (hi[key] >= f[4] ? "in some" : "no"))
  }
  # chart data: one row a two-node setting, per system min and max over the calls on chart_link
  if (chart_link == "") chart_link = lnk(calls[nc])
  out = dir "/chart.dat"; printf "# setting x (min max) per system\n" > out
  nr = split("nodes2|1p3b|1 nodes2|1p3b|4", CS, " ")
  for (i = 1; i <= nr; i++) {
    printf "\"%s\" %d", sname[CS[i]], i - 1 > out
    for (s = 1; s <= ns; s++) { cz = chart_link SUBSEP CS[i] SUBSEP s
      printf " %s %s", (cz in clo) ? clo[cz] : "?", (cz in chi) ? chi[cz] : "?" > out }
    print "" > out
  }
  print chart_link > (dir "/chart.link")
}' "$@" || exit 1

command -v gnuplot > /dev/null || { echo; echo "no gnuplot here: no chart (apt-get install gnuplot-nox)"; exit 0; }
CL=$(cat "$tmp/chart.link")
gnuplot 2> "$tmp/gp.err" <<EOF || { echo "gnuplot failed:"; cat "$tmp/gp.err"; exit 1; }
set terminal pngcairo size 1100,600 font ",11" noenhanced
set output "$PNG"
set datafile missing "?"
set style fill solid 0.85 border -1
set grid ytics
set yrange [0:*]
set xrange [-0.6:1.6]
set xtics ("2 nodes, GPT 1.31B, mb 1" 0, "2 nodes, GPT 1.31B, mb 4" 1)
set key outside top center horizontal width 2 samplen 2
set title "tokens/s of each system divided by the fastest FSDP2 of the same call (link $CL); bar: lowest call, whisker: highest" font ",11"
set ylabel "÷ FSDP2's tokens/s"
w = 0.15
plot for [s=1:5] "$tmp/chart.dat" using (\$2 + (s - 3) * w):(column(1 + 2 * s)):(w * 0.9) with boxes \
       title word("ours:ZeRO++ ours:ZeRO-3 FSDP2 DeepSpeed:ZeRO++ DeepSpeed:ZeRO-3", s), \
     for [s=1:5] "" using (\$2 + (s - 3) * w):(column(1 + 2 * s)):(column(1 + 2 * s)):(column(2 + 2 * s)) \
       with yerrorbars lc "black" ps 0 notitle, \
     for [s=1:5] "" using (\$2 + (s - 3) * w):(column(2 + 2 * s)):(column(1 + 2 * s) == column(2 + 2 * s) ? sprintf("%.2f", column(1 + 2 * s)) : sprintf("%.2f-%.2f", column(1 + 2 * s), column(2 + 2 * s))) \
       with labels offset 0,0.8 font ",8" notitle, \
     1 with lines dt 2 lc "black" notitle
EOF
echo; echo "chart: $PNG"
