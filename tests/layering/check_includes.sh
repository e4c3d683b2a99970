#!/usr/bin/env bash
# No source reaches a header by a relative path up the tree ("../"): headers
# come through the include directories of the layer (cmake/KvrLayers.cmake),
# which is what keeps an upward include from building.
set -u
cd "$(dirname "$0")/../.."
found=$(grep -rnE '^[[:space:]]*#[[:space:]]*include[[:space:]]*"\.\./' \
        --include='*.c' --include='*.h' --include='*.cu' --include='*.cuh' \
        src include tests bench)
if [ -n "$found" ]; then
    echo "includes by relative path (use the layer's include directories):"
    echo "$found"
    exit 1
fi
echo "no #include \"../...\" in src, include, tests, bench"
