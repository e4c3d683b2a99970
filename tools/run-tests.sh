#!/usr/bin/env bash
# `make test`: ctest in each build directory given, every suite run even when
# an earlier one failed, one line per suite at the end; exits 1 if any failed.
# An argument DIR:REGEX runs only the tests matching REGEX there (ctest -R).
# JOBS sets ctest's parallelism (default: nproc).
set -u
jobs=${JOBS:-$(nproc)}
status=0
report=()
for arg in "$@"; do
    dir=${arg%%:*}
    only=()
    [ "$dir" != "$arg" ] && only=(-R "${arg#*:}")
    echo "== ctest in $arg =="
    if (cd "$dir" && ctest --output-on-failure -j "$jobs" "${only[@]}"); then
        report+=("$arg: passed")
    else
        report+=("$arg: FAILED")
        status=1
    fi
done
echo "== test suites =="
printf '  %s\n' "${report[@]}"
exit "$status"
