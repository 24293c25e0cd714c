#!/usr/bin/env bash
# Whether two builds of runbook simulate every shipped scenario alike:
# the text and the -o json output of each, compared byte for byte.
#
#   tests/tools/same-simulate.sh BEFORE_BINARY AFTER_BINARY
#
# Run from the repository's top. Prints one line per scenario and exits 1
# on any difference (the diff's first lines shown).
set -uo pipefail
before=${1:?the runbook binary before}
after=${2:?the runbook binary after}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
differ=0
scenarios=(examples/*/ policies/scenarios/*.yaml)
for s in "${scenarios[@]}"; do
  [ -d "$s" ] && ! ls "$s"/*.yaml >/dev/null 2>&1 && continue
  for mode in text json; do
    args=(simulate "$s")
    [ "$mode" = json ] && args+=(-o json)
    "$before" "${args[@]}" >"$out/before" 2>&1
    rb=$?
    "$after" "${args[@]}" >"$out/after" 2>&1
    ra=$?
    if [ "$rb" != "$ra" ] || ! cmp -s "$out/before" "$out/after"; then
      # A scenario whose output differs from one run to the next of the
      # same build cannot be compared: said so, not counted.
      "$before" "${args[@]}" >"$out/again" 2>&1
      if ! cmp -s "$out/before" "$out/again"; then
        echo "UNSTABLE  $s ($mode: two runs of BEFORE differ; $(diff "$out/before" "$out/again" | grep -c '^<') lines)"
        continue
      fi
      echo "DIFFERENT $s ($mode; exit $rb vs $ra)"
      diff "$out/before" "$out/after" | head -10
      differ=1
    else
      echo "same      $s ($mode)"
    fi
  done
done
exit $differ
