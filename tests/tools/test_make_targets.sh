#!/usr/bin/env bash
# The Makefile's entry points: `make demo ARGS=...` reaches `kvrelay demo`,
# and `make test`'s runner runs every suite even when the first one fails,
# reports each, and fails if any failed. Usage: test_make_targets.sh SRC_DIR
set -euo pipefail
src=$1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

# make demo ARGS=...: the options reach tools/demo.sh, and demo.sh hands
# them to `kvrelay demo` (a stand-in binary prints its argv)
line=$(make -s -n -C "$src" demo ARGS="--requests 2 --json" | grep demo.sh) ||
    fail "make -n demo runs no tools/demo.sh"
[[ $line == *"tools/demo.sh build/bin/kvrelay --requests 2 --json"* ]] ||
    fail "make demo ARGS: '$line'"
printf '#!/bin/sh\necho "$@"\n' > "$work/fake-kvrelay"
chmod +x "$work/fake-kvrelay"
out=$("$src/tools/demo.sh" "$work/fake-kvrelay" --requests 2 --json)
[[ $out == "demo --requests 2 --json" ]] || fail "demo.sh passed '$out'"

# the runner: a failing suite first, then a passing one
for suite in bad good; do
    mkdir -p "$work/$suite"
    cmd=$([[ $suite == bad ]] && echo false || echo true)
    echo "add_test(${suite}_case \"$cmd\")" > "$work/$suite/CTestTestfile.cmake"
done
set +e
out=$(JOBS=1 "$src/tools/run-tests.sh" "$work/bad" "$work/good" 2>&1)
rc=$?
set -e
[[ $rc -ne 0 ]] || fail "runner exited 0 with a failing suite"
[[ $out == *"$work/bad: FAILED"* ]] || fail "no FAILED line for the bad suite: $out"
[[ $out == *"$work/good: passed"* ]] || fail "the good suite did not run: $out"
JOBS=1 "$src/tools/run-tests.sh" "$work/good" > /dev/null || fail "good suite alone"
echo "ok"
