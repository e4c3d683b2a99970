#!/usr/bin/env bash
# The README's `kvrelay inspect` example, run as written: its commands create
# the dump they inspect (a user has nothing else), the clean dump exits 0,
# the damaged one exits 1, and every output line the README quotes appears.
# Usage: test_readme_inspect.sh KVRELAY README.md
set -euo pipefail
kvr=$(realpath "$1")
readme=$(realpath "$2")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"
fail() { echo "FAIL: $*" >&2; exit 1; }

section=$(sed -n '/^### `kvrelay inspect`/,/^Exit 0 clean/p' "$readme")
mapfile -t cmds < <(grep '^\$ ' <<< "$section" | cut -c3-)
[[ ${#cmds[@]} -ge 3 ]] || fail "no commands in the README's inspect section"
: > log.txt
codes=()
for c in "${cmds[@]}"; do
    set +e
    eval "${c/#kvrelay /\"$kvr\" }" >> log.txt 2>&1
    rc=$?
    set -e
    [[ $c == kvrelay\ inspect* ]] && codes+=("$rc")
    [[ $c == kvrelay\ inspect* || $rc -eq 0 ]] || fail "'$c' exited $rc: $(cat log.txt)"
done
[[ "${codes[*]}" == "0 1" ]] || fail "inspect exit codes '${codes[*]}', want '0 1'"
while IFS= read -r line; do
    want=${line%; ...}
    grep -qF -- "$want" log.txt || fail "README line not in the output: $want"
done < <(sed -n '/^```$/,/^```$/p' <<< "$section" | grep -v '^```\|^\$ \|^\.\.\.$')
echo ok
