#!/usr/bin/env bash
# verify-test-tools.sh checks that `make test` builds every tool its tests
# start (run by `make verify`; cheap: it builds nothing).
#
# A machine that once ran another target keeps that target's tools in the
# cache, so a prerequisite missing from `make test` shows only on a new
# machine. This check sees what a new machine would: with an empty tools
# directory and bin/ (TOOLS_DIR and BIN_DIR pointed at a directory that does
# not exist), it lists what the Makefile exports to the tests (`make
# test-env`: KUBEBUILDER_ASSETS and every HEADWATER_* variable) and what
# a dry run of the prerequisites of `make test` (TEST_TOOLS) would build, and fails for each exported path that no step
# of `make test` creates:
#   - a path under TOOLS_DIR must lie in a directory hack/build-tools.sh
#     builds (its -print-dirs) for a component the dry run asks it for;
#   - a path under BIN_DIR must be written by a step of the dry run, or be
#     a directory that a written path lies in
#     (`mkdir -p`, `-o`, `-archive` or the target of `ln`).
set -euo pipefail
cd "$(dirname "$0")/.."
say() { printf '%s\n' "$*" >&2; }

root=$(mktemp -d)
trap 'rm -rf "$root"' EXIT
tools="$root/tools" bin="$root/bin"
vars=(TOOLS_DIR="$tools" BIN_DIR="$bin")

env_lines=$(make -s --no-print-directory test-env "${vars[@]}")
# The prerequisites of `make test` (its recipe runs the tests and builds
# nothing; a dry run of it would run them, since it calls make).
read -r -a prereqs <<<"$(make -s --no-print-directory test-tools)"
if ! plan=$(make -n --no-print-directory "${prereqs[@]}" "${vars[@]}" 2>&1); then
	say "make -n ${prereqs[*]} failed:"
	say "$plan"
	exit 1
fi

# The directories hack/build-tools.sh builds for the components asked for.
built=()
while read -r comps; do
	# shellcheck disable=SC2086 # a list of components
	mapfile -t -O "${#built[@]}" built < <(hack/build-tools.sh -print-dirs "$tools" $comps)
done < <(grep -oE "hack/build-tools\.sh $tools( [a-z-]+)+" <<<"$plan" | sed "s#^hack/build-tools\.sh $tools ##")

# What the steps of `make test` write under BIN_DIR.
mapfile -t written < <(grep -oE "(mkdir -p|-o|-archive) $bin[^ ;'\"]*" <<<"$plan" | awk '{print $NF}'
	grep -oE "ln -[sf]+ [^ ]+ $bin[^ ;'\"]*" <<<"$plan" | awk '{print $NF}')

# under <path> <dir>: whether path is dir or lies in it.
under() { [ "$1" = "$2" ] || [[ $1 == "$2"/* ]]; }

fail=0
checked=0
while IFS='=' read -r name value; do
	[ -n "$name" ] || continue
	IFS=: read -r -a paths <<<"$value"
	for p in "${paths[@]}"; do
		[ -n "$p" ] || continue
		checked=$((checked + 1))
		ok=
		if under "$p" "$tools"; then
			for d in "${built[@]}"; do under "$p" "$d" && ok=1 && break; done
		elif under "$p" "$bin"; then
			for w in "${written[@]}"; do under "$w" "$p" && ok=1 && break; done
		else
			say "$name=$p lies neither in TOOLS_DIR nor in BIN_DIR: a test would read something no make target builds"
			fail=1
			continue
		fi
		if [ -z "$ok" ]; then
			say "$name=${p/$root/<fresh>} is exported to the tests, but no prerequisite of \`make test\` builds it: add the target that does to TEST_TOOLS in the Makefile"
			fail=1
		fi
	done
done <<<"$env_lines"

if [ "$checked" -eq 0 ]; then
	say "make test-env listed no tool path: the check would pass vacuously"
	exit 1
fi
if [ "$fail" -ne 0 ]; then
	exit 1
fi
echo "verify-test-tools: ok ($checked tool paths, each built by \`make test\`)"
