#!/bin/sh
# The source layout docs/architecture.md promises (issue 36 item 7): every folder of src/ is in
# its "Source layout" table, and a feature's files live in the feature's folder, not loose at the
# top of src/ (src/delta/, src/copy/, src/plan/; a transport's helpers in its own folder).
# Usage: check_layout.sh <source root>
set -eu
root=$1
doc="$root/docs/architecture.md"
table=$(sed -n '/^## Source layout/,/^## /p' "$doc")
[ -n "$table" ] || { echo "FAIL: docs/architecture.md has no '## Source layout' section"; exit 1; }
bad=0
for d in "$root"/src/*/; do
  name=$(basename "$d")
  printf '%s\n' "$table" | grep -q "\`src/$name/" || {
    echo "FAIL: src/$name/ is not in docs/architecture.md's Source layout table"; bad=1; }
done
for f in "$root"/src/*; do
  [ -f "$f" ] || continue
  case $(basename "$f") in
    delta*|copy*|planner*|parts*|layout*|select*|fd_exporter*)
      echo "FAIL: src/$(basename "$f") is a feature file loose at the top of src/ (move it into its folder)"
      bad=1 ;;
  esac
done
[ "$bad" = 0 ] && echo "source layout: every src/ folder documented, no loose feature file"
exit "$bad"
