#!/usr/bin/env bash
# Fails (exit 1) when a file outside docs/ cites a document that is not in the
# repository, listing file:line for each. The repository must stand alone:
# comments cite docs/design.md §N and the other files under docs/.
# Usage: tools/check-doc-refs.sh [SOURCE_DIR]   (default: the current directory)
# Exit 77 (ctest SKIP) when SOURCE_DIR is not a git checkout.
set -euo pipefail

root=${1:-.}
self=tools/check-doc-refs.sh

# Documents that lived beside the repository, never in it.
pattern='DESIGN(\.md)?[[:space:]]*§|DESIGN\.md|REFERENCE-ATOM|STYLE\.md|UCX-NOTES|\.\./shared/|/work/shared'

if ! files=$(git -C "$root" ls-files --cached --others --exclude-standard 2>/dev/null); then
  echo "check-doc-refs: $root is not a git checkout; skipped" >&2
  exit 77
fi

hits=$(cd "$root" &&
  printf '%s\n' "$files" | grep -v -e '^docs/' -e "^$self\$" |
  while IFS= read -r f; do [ -f "$f" ] && printf '%s\0' "$f"; done |
  xargs -0 -r grep -nIE "$pattern" -- || true)

if [ -n "$hits" ]; then
  echo "check-doc-refs: these cite documents outside the repository;" >&2
  echo "cite docs/design.md §N (or another file under docs/) instead:" >&2
  printf '%s\n' "$hits" >&2
  exit 1
fi
echo "check-doc-refs: no file outside docs/ cites a document outside the repository"
