#!/usr/bin/env bash
# Fails on a broken relative link in the project's markdown: README.md,
# DESIGN.md and docs/*.md. For every [text](target) whose target is not a URL
# (http:, https:, mailto:) it checks that the file or folder exists, relative
# to the page, and, for target#anchor (or #anchor alone), that the page
# linked to has a heading whose GitHub anchor is that one (lowercased,
# punctuation but - and _ dropped, spaces as -). Fenced code blocks and
# inline code are skipped.
# Usage: tests/test_docs_links.sh [REPO_ROOT]
set -uo pipefail
root=${1:-$(cd "$(dirname "$0")/.." && pwd)}
cd "$root" || exit 2

# The GitHub anchors of a markdown file's headings, one a line.
anchors() {
  awk '/^```/ { code = !code; next } !code && /^#+ / { sub(/^#+ +/, ""); print }' "$1" |
    sed -e 's/`//g' | tr '[:upper:]' '[:lower:]' |
    sed -e 's/[][!"#$%&'"'"'()*+,./:;<=>?@\\^{|}~]//g' -e 's/ /-/g' |
    awk '{ n = seen[$0]++; print (n ? $0 "-" n : $0) }'
}

# Each link target of a markdown file, one a line (code skipped).
targets() {
  awk '/^```/ { code = !code; next } !code' "$1" |
    sed -e 's/`[^`]*`//g' |
    grep -o '\]([^) ]*)' | sed -e 's/^](//' -e 's/)$//'
}

files=(README.md DESIGN.md docs/*.md)
bad=0 checked=0
for f in "${files[@]}"; do
  [ -f "$f" ] || continue
  dir=$(dirname "$f")
  while IFS= read -r t; do
    case "$t" in http://* | https://* | mailto:* | "") continue ;; esac
    checked=$((checked + 1))
    path=${t%%#*}
    anchor=""
    case "$t" in *'#'*) anchor=${t#*#} ;; esac
    if [ -n "$path" ]; then
      target="$dir/$path"
      if [ ! -e "$target" ]; then
        echo "$f: broken link ($t): $target does not exist"
        bad=1
        continue
      fi
    else
      target=$f
    fi
    if [ -n "$anchor" ]; then
      case "$target" in
        *.md)
          if ! anchors "$target" | grep -qxF -- "$anchor"; then
            echo "$f: broken link ($t): no heading in $target has the anchor #$anchor"
            bad=1
          fi
          ;;
      esac
    fi
  done < <(targets "$f")
done
if [ "$checked" -eq 0 ]; then
  echo "no relative links found: is $root the repository?"
  exit 1
fi
[ "$bad" -eq 0 ] && echo "$checked relative links in ${#files[@]} files: all resolve"
exit "$bad"
