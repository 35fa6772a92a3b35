#!/usr/bin/env bash
# build-tools.sh builds the real components the tests and `make run` use --
# kube-apiserver, kubectl, etcd (the binaries envtest runs), the MinIO
# server and the CNCF distribution registry -- from the Go module proxy, and
# caches them by version.
#
# Usage: hack/build-tools.sh [-print-dirs] <tools-dir> [kube|kube-node|etcd|minio|fake-gcs-server|azurite|registry|controller-gen|flux|kustomize-controller|notification-controller|nats-server|coredns ...]
#
# -print-dirs builds nothing: it prints the directory each component is
# built into, a line each (hack/verify-test-tools.sh checks with it that
# `make test` builds every tool its tests start).
#
# fake-gcs-server (Google Cloud Storage's JSON API, built from its Go module)
# and Azurite (Azure Blob Storage, installed from the npm registry; it needs
# node) are the emulators the gcp and azure Bucket providers are tested
# against.
#
# nats-server and coredns are the binaries of the third-party images
# hack/imagebuild assembles (`make image-archive`); CoreDNS comes from the
# scratch module hack/tools/coredns, which links only the plugins a cluster
# DNS needs.
#
# flux is Flux's source-controller, the peer `make bench` measures Headwater
# against side by side, and the controller the cluster tests switch from and
# back to (`make flux-image-archive` makes it an image). It is built from its module as published, never
# copied into this repository: the module zip leaves out the api/ directory
# its go.mod replaces with ./api, so the API module of the same version is
# put there first.
#
# kustomize-controller and notification-controller are Flux's consumers of
# source artifacts and of source Events, built the same way from their
# published modules, each with its CRDs in crds/ beside the binary; `make
# flux-image-archive` makes them into the images the cluster tests run
# beside Headwater (e2e/clustertest, TestFluxControllers).
#
# Binaries land in <tools-dir>/<name>-<version>/ and are reused when present,
# so a warm run costs nothing. A cold run takes a few minutes on two cores.
# Versions are pinned by the scratch modules under hack/tools/ (whose go.mod
# and go.sum are committed) and by the variables below.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
print_dirs=
if [ "${1:-}" = -print-dirs ]; then
	print_dirs=1
	shift
fi
tools_dir=${1:?usage: build-tools.sh [-print-dirs] <tools-dir> [component...]}
shift
components=("$@")
[ ${#components[@]} -gt 0 ] || components=(kube etcd minio fake-gcs-server azurite registry controller-gen)

KUBE_VERSION=v1.34.4
ETCD_VERSION=v3.6.16
MINIO_VERSION=v0.0.0-20260212201848-7aac2a2c5b7c
CONTROLLER_GEN_VERSION=v0.23.0
REGISTRY_VERSION=v3.1.2
FAKE_GCS_SERVER_VERSION=v1.56.1
AZURITE_VERSION=3.37.0
FLUX_SOURCE_CONTROLLER_VERSION=v1.9.1
FLUX_KUSTOMIZE_CONTROLLER_VERSION=v1.9.5
FLUX_NOTIFICATION_CONTROLLER_VERSION=v1.9.3
NATS_SERVER_VERSION=v2.15.2
COREDNS_VERSION=v1.12.4

export GOWORK=off CGO_ENABLED=0 GOFLAGS=-buildvcs=false

log() { printf '==> %s\n' "$*" >&2; }

# build_once <dir> <label> <command...>: runs the command unless <dir>/.done
# exists. Two runs at once (two clones sharing the cache) take turns on a
# lock, so the second reuses what the first built instead of building into
# the same temporary directory.
build_once() {
	local dir=$1 label=$2
	shift 2
	if [ -n "$print_dirs" ]; then
		echo "$dir"
		return 0
	fi
	if [ -f "$dir/.done" ]; then
		return 0
	fi
	mkdir -p "$(dirname "$dir")"
	exec {lock}>"$dir.lock"
	flock "$lock"
	if [ -f "$dir/.done" ]; then
		exec {lock}>&-
		return 0
	fi
	log "building $label into $dir (first time only; takes a few minutes)"
	rm -rf "$dir.tmp"
	mkdir -p "$dir.tmp"
	(cd "$here" && "$@" "$dir.tmp")
	rm -rf "$dir"
	mv "$dir.tmp" "$dir"
	touch "$dir/.done"
	exec {lock}>&-
	log "built $label"
}

kube() {
	local out=$1 v=${KUBE_VERSION#v}
	local pkg=k8s.io/component-base/version
	local ldflags="-s -w -X $pkg.gitVersion=$KUBE_VERSION -X $pkg.gitMajor=${v%%.*} -X $pkg.gitMinor=$(echo "$v" | cut -d. -f2)"
	cd tools/kube
	go build -trimpath -ldflags "$ldflags" -o "$out/kube-apiserver" k8s.io/kubernetes/cmd/kube-apiserver
	go build -trimpath -ldflags "$ldflags" -o "$out/kubectl" k8s.io/kubernetes/cmd/kubectl
}

# kube_node builds the node and controller components the cluster tests run
# (hack/cluster): kubelet, kube-proxy, kube-scheduler and
# kube-controller-manager, from the same module and version as kube-apiserver.
kube_node() {
	local out=$1 v=${KUBE_VERSION#v}
	local pkg=k8s.io/component-base/version
	local ldflags="-s -w -X $pkg.gitVersion=$KUBE_VERSION -X $pkg.gitMajor=${v%%.*} -X $pkg.gitMinor=$(echo "$v" | cut -d. -f2)"
	cd tools/kube
	for c in kubelet kube-proxy kube-scheduler kube-controller-manager; do
		go build -trimpath -ldflags "$ldflags" -o "$out/$c" "k8s.io/kubernetes/cmd/$c"
	done
}

etcd() {
	cd tools/etcd
	go build -trimpath -ldflags "-s -w" -o "$1/etcd" go.etcd.io/etcd/server/v3
}

minio() {
	GOBIN=$1 go install -trimpath -ldflags "-s -w" "github.com/minio/minio@$MINIO_VERSION"
}

fake_gcs_server() {
	GOBIN=$1 go install -trimpath -ldflags "-s -w" "github.com/fsouza/fake-gcs-server@$FAKE_GCS_SERVER_VERSION"
}

# azurite installs the Azure Storage emulator and its dependencies into
# <out>/node_modules; <out>/azurite-blob runs its Blob service.
azurite() {
	local out=$1
	command -v node >/dev/null || { echo "azurite needs node (apt-get install nodejs npm)" >&2; return 1; }
	npm install --prefix "$out" --no-audit --no-fund --no-save --loglevel=error "azurite@$AZURITE_VERSION" >&2
	ln -s node_modules/.bin/azurite-blob "$out/azurite-blob"
}

registry() {
	GOBIN=$1 go install -trimpath -ldflags "-s -w" "github.com/distribution/distribution/v3/cmd/registry@$REGISTRY_VERSION"
}

controller_gen() {
	GOBIN=$1 go install "sigs.k8s.io/controller-tools/cmd/controller-gen@$CONTROLLER_GEN_VERSION"
}

nats_server() {
	GOBIN=$1 go install -trimpath -ldflags "-s -w" "github.com/nats-io/nats-server/v2@$NATS_SERVER_VERSION"
}

coredns() {
	cd tools/coredns
	go build -trimpath -ldflags "-s -w" -o "$1/coredns" .
}

# flux_controller <module> <version> <binary> <out>: builds a Flux controller
# from its module zip, with the api/ submodule of the same version put where
# its go.mod's replace expects it, and keeps the CRDs of its kinds
# (config/crd/bases) beside the binary, in <out>/crds.
flux_controller() {
	local mod=$1 version=$2 bin=$3 out=$4 src
	src=$(mktemp -d)
	# shellcheck disable=SC2064
	trap "chmod -R u+w '$src'; rm -rf '$src'" RETURN
	cp -r "$(go mod download -json "$mod@$version" | sed -n 's/^\t"Dir": "\(.*\)",$/\1/p')/." "$src/"
	chmod -R u+w "$src"
	rm -rf "$src/api"
	mkdir "$src/api"
	cp -r "$(go mod download -json "$mod/api@$version" | sed -n 's/^\t"Dir": "\(.*\)",$/\1/p')/." "$src/api/"
	chmod -R u+w "$src/api"
	(cd "$src" && go build -trimpath -ldflags "-s -w" -o "$out/$bin" .)
	cp -r "$src/config/crd/bases" "$out/crds"
}

for c in "${components[@]}"; do
	case $c in
	kube) build_once "$tools_dir/kube-$KUBE_VERSION" "kube-apiserver and kubectl $KUBE_VERSION" kube ;;
	kube-node) build_once "$tools_dir/kube-node-$KUBE_VERSION" "kubelet, kube-proxy, kube-scheduler and kube-controller-manager $KUBE_VERSION" kube_node ;;
	etcd) build_once "$tools_dir/etcd-$ETCD_VERSION" "etcd $ETCD_VERSION" etcd ;;
	minio) build_once "$tools_dir/minio-$MINIO_VERSION" "minio $MINIO_VERSION" minio ;;
	registry) build_once "$tools_dir/registry-$REGISTRY_VERSION" "registry $REGISTRY_VERSION" registry ;;
	fake-gcs-server) build_once "$tools_dir/fake-gcs-server-$FAKE_GCS_SERVER_VERSION" "fake-gcs-server $FAKE_GCS_SERVER_VERSION" fake_gcs_server ;;
	azurite) build_once "$tools_dir/azurite-$AZURITE_VERSION" "Azurite $AZURITE_VERSION" azurite ;;
	flux) build_once "$tools_dir/flux-source-controller-$FLUX_SOURCE_CONTROLLER_VERSION" "Flux source-controller $FLUX_SOURCE_CONTROLLER_VERSION" \
		flux_controller github.com/fluxcd/source-controller "$FLUX_SOURCE_CONTROLLER_VERSION" source-controller ;;
	kustomize-controller) build_once "$tools_dir/flux-kustomize-controller-$FLUX_KUSTOMIZE_CONTROLLER_VERSION" "Flux kustomize-controller $FLUX_KUSTOMIZE_CONTROLLER_VERSION" \
		flux_controller github.com/fluxcd/kustomize-controller "$FLUX_KUSTOMIZE_CONTROLLER_VERSION" kustomize-controller ;;
	notification-controller) build_once "$tools_dir/flux-notification-controller-$FLUX_NOTIFICATION_CONTROLLER_VERSION" "Flux notification-controller $FLUX_NOTIFICATION_CONTROLLER_VERSION" \
		flux_controller github.com/fluxcd/notification-controller "$FLUX_NOTIFICATION_CONTROLLER_VERSION" notification-controller ;;
	nats-server) build_once "$tools_dir/nats-server-$NATS_SERVER_VERSION" "nats-server $NATS_SERVER_VERSION" nats_server ;;
	coredns) build_once "$tools_dir/coredns-$COREDNS_VERSION" "CoreDNS $COREDNS_VERSION" coredns ;;
	controller-gen) build_once "$tools_dir/controller-gen-$CONTROLLER_GEN_VERSION" "controller-gen $CONTROLLER_GEN_VERSION" controller_gen ;;
	*) echo "unknown component: $c" >&2; exit 2 ;;
	esac
done
