#!/usr/bin/env bash
# libkvrelay.so exports the public kvr_ functions and nothing else: no kvr__
# internal and no symbol of another name (-fvisibility=hidden, KVR_API_BEGIN
# in kvrelay/status.h).
set -u
lib=$1
syms=$(nm -D --defined-only "$lib" | awk '{print $NF}') || exit 1
n=$(printf '%s\n' "$syms" | grep -c '^kvr_')
internal=$(printf '%s\n' "$syms" | grep '^kvr__')
other=$(printf '%s\n' "$syms" | grep -v '^kvr_' | grep -v '^$')
if [ -n "$internal" ] || [ -n "$other" ] || [ "$n" -lt 50 ]; then
    echo "$lib exports $n kvr_ symbols; wrong ones:"
    printf '%s\n' "$internal" "$other" | grep -v '^$'
    exit 1
fi
echo "$lib exports $n symbols, all public kvr_"
