#!/usr/bin/env bash
# verify.sh checks what must stay in sync (run by `make verify`, after
# `make manifests` has regenerated the CRDs and `make chart` the chart):
#   - the generated CRDs, RBAC and NATS authorization (the receivers and
#     httpsource components' included) and the Helm chart (charts/headwater, from
#     deploy/) match the committed ones;
#   - go.work lists every module of the workspace;
#   - every module's go.mod and go.sum are tidy;
#   - every module resolves the shared dependencies to the same versions;
#   - no service binary (nor headwater, which is all of them) links a NATS
#     server, the testsupport module or Helm's and kubectl's heavy packages;
#   - the JSON Schemas (docs/schemas) and wire format golden files
#     (pkg/events/testdata/wire) match the event structs.
set -euo pipefail
cd "$(dirname "$0")/.."
fail=0
say() { printf '%s\n' "$*" >&2; }

generated="deploy/crds deploy/base/rbac deploy/base/nats/auth.conf deploy/components/receivers/crd deploy/components/receivers/rbac deploy/components/dispatcher/rbac deploy/components/httpsource/crd deploy/components/httpsource/nats/auth.conf pkg/apis services/httpsource-fetcher/api charts/headwater"
# shellcheck disable=SC2086 # a list of paths
if [ -n "$(git status --porcelain -- $generated)" ]; then
	say "generated manifests and code ($generated) are out of date: run 'make generate' and commit the result"
	# shellcheck disable=SC2086
	git status --porcelain -- $generated >&2
	fail=1
fi

# Modules of the workspace: every go.mod except the pinned tool modules
# under hack/, which build on their own with GOWORK=off.
mapfile -t modules < <(find . -name go.mod -not -path './hack/*' -not -path './bin/*' -not -path './.run/*' \
	-printf '%h\n' | sed 's#^\./##' | sort)
mapfile -t used < <(go work edit -json | sed -n 's/.*"DiskPath": "\.\/\(.*\)".*/\1/p' | sort)
if [ "${modules[*]}" != "${used[*]}" ]; then
	say "go.work does not list exactly the workspace modules:"
	say "  modules: ${modules[*]}"
	say "  go.work: ${used[*]}"
	fail=1
fi

for m in "${modules[@]}"; do
	if ! (cd "$m" && go mod tidy -diff >/dev/null 2>&1); then
		say "$m: go.mod/go.sum are not tidy: run 'cd $m && go mod tidy'"
		fail=1
	fi
done

# The hack/ modules that build on their own (GOWORK=off) stay tidy too.
for m in hack/deployvalidate hack/imagebuild hack/chartgen; do
	if ! (cd "$m" && GOWORK=off go mod tidy -diff >/dev/null 2>&1); then
		say "$m: go.mod/go.sum are not tidy: run 'cd $m && GOWORK=off go mod tidy'"
		fail=1
	fi
done

# One resolution for the whole workspace: each module, built on its own,
# must pick the same versions of the dependencies the services share.
shared="k8s.io/api k8s.io/apimachinery k8s.io/client-go sigs.k8s.io/controller-runtime github.com/fluxcd/source-controller/api github.com/nats-io/nats.go github.com/cloudevents/sdk-go/v2 helm.sh/helm/v3"
declare -A seen
for m in "${modules[@]}"; do
	while read -r path version; do
		[ -n "$version" ] || continue
		if [ -n "${seen[$path]:-}" ] && [ "${seen[$path]}" != "$version" ]; then
			say "$m resolves $path $version, another module ${seen[$path]}: run 'go work sync'"
			fail=1
		fi
		seen[$path]=$version
	done < <(cd "$m" && for p in $shared; do GOWORK=off go list -m -f '{{.Path}} {{.Version}}' "$p" 2>/dev/null || true; done)
done

# A service binary links only what it runs: the test servers of the
# testsupport module, and the NATS server they embed, are for tests and the
# local runner (e2e) only; a service dials NATS through pkg/bus.
heavy='^(k8s\.io/kubectl|helm\.sh/helm/v3/pkg/(repo|getter|action|kube|cli))(/|$)'
forbidden='^(github\.com/nats-io/nats-server/v2|github\.com/headwater-gitops/headwater/testsupport)(/|$)'
for m in "${modules[@]}"; do
	[[ $m == services/* || $m == cmd/headwater ]] || continue
	if ! deps=$(cd "$m" && go list -deps . 2>&1); then
		say "$m: go list -deps failed:"
		say "$deps"
		fail=1
		continue
	fi
	if linked=$(grep -E "$forbidden" <<<"$deps"); then
		say "$m: the service binary links test support; only tests may import it:"
		say "$(sed 's/^/  /' <<<"$linked")"
		fail=1
	fi
	# Every replica maps its whole binary: Helm's repo, getter and action
	# packages link kubectl and most of client-go (half the fetcher's size)
	# for nothing a service runs.
	if linked=$(grep -E "$heavy" <<<"$deps"); then
		say "$m: the service binary links a package it does not need, which doubles its size:"
		say "$(sed 's/^/  /' <<<"$linked")"
		fail=1
	fi
done

# The bus contract's generated schemas and golden files: a struct changed
# without `go test ./events -run 'TestSchemas|TestWireFormat' -update`.
if ! out=$(cd pkg && go test -count=1 -run '^(TestSchemas|TestWireFormat)$' ./events 2>&1); then
	say "docs/schemas or pkg/events/testdata/wire do not match pkg/events: run 'cd pkg && go test ./events -run \"TestSchemas|TestWireFormat\" -update', review and commit:"
	say "$out"
	fail=1
fi

if [ "$fail" -ne 0 ]; then
	exit 1
fi
echo "verify: ok"
