#!/usr/bin/env bash
# The tokenizer's speed on one core: `zeropp tokenize` with GPT-2's files on
#   ts1    Tiny Shakespeare (1.1 MB);
#   ts100  it 100 times over (111.5 MB: every word is met again, so this is the
#          cache's best case);
#   docs   the first 111.5 MB of this machine's man pages and /usr/share/doc text
#          (changelogs, licences, manuals: many words met once, some invalid UTF-8);
# each with the default piece cache and with none (--cache 0: every piece merged).
# Prints wall and CPU seconds; CPU time is the figure to compare on a busy machine.
# Usage: bench/tokenize/speed.sh DIR   (DIR holds vocab.json and merges.txt;
#        ZEROPP=build/zeropp, TEXT=../shared/data/tinyshakespeare.txt, WORK=/tmp/zpp-tok)
set -euo pipefail
cd "$(dirname "$0")/../.."
dir=${1:?usage: bench/tokenize/speed.sh DIR-with-vocab.json-and-merges.txt}
Z=${ZEROPP:-build/zeropp}
TEXT=${TEXT:-../shared/data/tinyshakespeare.txt}
W=${WORK:-/tmp/zpp-tok}
mkdir -p "$W"
[ -s "$W/ts100.txt" ] || for _ in $(seq 100); do cat "$TEXT"; done > "$W/ts100.txt"
size=$(stat -c %s "$W/ts100.txt")
if ! [ -s "$W/docs.txt" ]; then
  find /usr/share/doc /usr/share/common-licenses /usr/share/man/man1 /usr/share/man/man3 -type f | sort |
    while read -r f; do
      case $f in *.gz) zcat "$f" 2>/dev/null || true ;;
                 *.txt|*README*|*copyright|*NEWS*|*changelog*|*.md) cat "$f" ;; esac
    done | head -c "$size" > "$W/docs.txt" || true # (head ends the pipe early)
fi
echo "$(date -u +%FT%TZ) $(git rev-parse --short HEAD) $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2)," \
     "$(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
for name in ts1 ts100 docs; do
  case $name in ts1) f=$TEXT ;; *) f=$W/$name.txt ;; esac
  for cache in default 0; do
    opt=(); [ "$cache" = 0 ] && opt=(--cache 0)
    /usr/bin/time -f "  %e s wall, %U s user + %S s sys, %M KB" \
      "$Z" tokenize --vocab "$dir/vocab.json" --merges "$dir/merges.txt" "${opt[@]}" "$f" "$W/$name.bin" 2>&1 |
      sed "s|^wrote|$name, cache $cache: wrote|"
  done
done
