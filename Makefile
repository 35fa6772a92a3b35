# Headwater: a horizontally scalable source controller for GitOps.
#
#   make run    the whole system on the embedded default
#   make test   every test (unit, integration and end-to-end)
#
# Real components (kube-apiserver, etcd, kubectl, MinIO, fake-gcs-server,
# the distribution registry, controller-gen, nats-server and CoreDNS for the
# images) are built once from the Go module proxy, and Azurite installed
# from the npm registry, by hack/build-tools.sh and cached by version under
# TOOLS_DIR, outside the clone, so fresh clones reuse them.

SHELL := /usr/bin/env bash -o pipefail
.DEFAULT_GOAL := help

SERVICES    := watcher fetcher packager artifact-server receiver dispatcher setup httpsource-fetcher
MODULES     := pkg testsupport $(addprefix services/,$(SERVICES)) cmd/headwater e2e
# Modules outside go.work, built and tested with GOWORK=off.
HACK_MODULES := hack/deployvalidate hack/imagebuild hack/chartgen
BIN_DIR     := $(CURDIR)/bin
TOOLS_DIR   ?= $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/headwater/tools
CRD_DIR     := deploy/crds
RBAC_DIR    := deploy/base/rbac
RECEIVERS_DIR := deploy/components/receivers
HTTPSOURCE_DIR := deploy/components/httpsource

KUBE_VERSION           := v1.34.4
ETCD_VERSION           := v3.6.16
MINIO_VERSION          := v0.0.0-20260212201848-7aac2a2c5b7c
CONTROLLER_GEN_VERSION := v0.23.0
REGISTRY_VERSION       := v3.1.2
FAKE_GCS_SERVER_VERSION := v1.56.1
AZURITE_VERSION        := 3.37.0
FLUX_SOURCE_CONTROLLER_VERSION := v1.9.1
FLUX_KUSTOMIZE_CONTROLLER_VERSION    := v1.9.5
FLUX_NOTIFICATION_CONTROLLER_VERSION := v1.9.3
NATS_SERVER_VERSION    := v2.15.2
COREDNS_VERSION        := v1.12.4

# The directory envtest reads kube-apiserver, etcd and kubectl from.
KUBEBUILDER_ASSETS := $(BIN_DIR)/k8s
CONTROLLER_GEN     := $(TOOLS_DIR)/controller-gen-$(CONTROLLER_GEN_VERSION)/controller-gen
MINIO              := $(TOOLS_DIR)/minio-$(MINIO_VERSION)/minio
REGISTRY_BIN       := $(TOOLS_DIR)/registry-$(REGISTRY_VERSION)/registry
FAKE_GCS_SERVER    := $(TOOLS_DIR)/fake-gcs-server-$(FAKE_GCS_SERVER_VERSION)/fake-gcs-server
AZURITE_BLOB       := $(TOOLS_DIR)/azurite-$(AZURITE_VERSION)/azurite-blob
NATS_SERVER        := $(TOOLS_DIR)/nats-server-$(NATS_SERVER_VERSION)/nats-server
COREDNS            := $(TOOLS_DIR)/coredns-$(COREDNS_VERSION)/coredns
FLUX_SOURCE_CONTROLLER := $(TOOLS_DIR)/flux-source-controller-$(FLUX_SOURCE_CONTROLLER_VERSION)/source-controller
# Flux's kustomize- and notification-controller, each with its CRDs in crds/
# beside the binary, for the cluster tests that run them beside Headwater.
FLUX_KUSTOMIZE_CONTROLLER_DIR    := $(TOOLS_DIR)/flux-kustomize-controller-$(FLUX_KUSTOMIZE_CONTROLLER_VERSION)
FLUX_NOTIFICATION_CONTROLLER_DIR := $(TOOLS_DIR)/flux-notification-controller-$(FLUX_NOTIFICATION_CONTROLLER_VERSION)

# kubelet, kube-proxy, kube-scheduler and kube-controller-manager for the
# cluster tests' node (e2e/cluster), and the images it runs.
KUBE_NODE_DIR := $(TOOLS_DIR)/kube-node-$(KUBE_VERSION)
IMAGE_ARCHIVE := $(BIN_DIR)/images/headwater-images.tar
# Flux's source-, kustomize- and notification-controller's images, in an
# archive of their own: only the full cluster tests import it
# (TestFluxControllers, TestFluxMigration).
FLUX_IMAGE_ARCHIVE := $(BIN_DIR)/images/flux-images.tar

# What the tests are told (the tool paths they start), exported to every
# recipe. Each is built by a prerequisite of `make test`: `make verify`
# checks it (hack/verify-test-tools.sh), since a tools cache left by an
# earlier run hides a missing one (a test that cannot find its tool names
# the make target that builds it).
export KUBEBUILDER_ASSETS
export HEADWATER_KUBE_NODE_DIR := $(KUBE_NODE_DIR)
export HEADWATER_IMAGES := $(IMAGE_ARCHIVE)
export HEADWATER_MINIO_BIN := $(MINIO)
export HEADWATER_REGISTRY_BIN := $(REGISTRY_BIN)
export HEADWATER_FAKE_GCS_SERVER_BIN := $(FAKE_GCS_SERVER)
export HEADWATER_AZURITE_BIN := $(AZURITE_BLOB)
export HEADWATER_BIN_DIR   := $(BIN_DIR)
# Flux's kustomize-controller (binary and CRDs), which the e2e tests run
# against ExternalArtifacts (make flux-kustomize-controller); the full
# cluster tests add notification-controller's CRDs (test-cluster below).
export HEADWATER_FLUX_CRDS   := $(FLUX_KUSTOMIZE_CONTROLLER_DIR)/crds

# The prerequisites of `make test`: every tool any test it runs starts,
# those of the node test (test-cluster CLUSTER_TESTS=short) included.
TEST_TOOLS := kube-tools minio bucket-emulators registry flux-kustomize-controller build \
	kube-node cluster-deps image-archive

GO_TEST_FLAGS ?= -count=1

# Fuzz targets, as <module dir>:<package>:<target>. `make test` runs each
# for FUZZ_SHORT executions; `make fuzz` for FUZZTIME executions. Both are
# counts (`Nx`), not durations: Go 1.26's fuzz coordinator can report a
# spurious "context deadline exceeded" when a duration runs out while a
# worker is mid-call on a loaded machine (golang/go#75804, fixed in Go 1.27),
# and a count has no deadline to race.
FUZZ_TARGETS := pkg:./archive:FuzzCanonicalize pkg:./archive:FuzzMerge pkg:./events:FuzzDecode \
	services/fetcher:./internal/ignore:FuzzFilter services/fetcher:./internal/gitfetch:FuzzRevision \
	services/fetcher:./internal/helmindex:FuzzIndex
FUZZ_SHORT ?= 2000x
FUZZTIME   ?= 500000x

# Build information stamped into every service (pkg/buildinfo; -version, the
# start-up log line and headwater_build_info). A clone without tags describes
# itself by its abbreviated commit; outside git the values stay empty and the
# binaries fall back to what Go recorded.
VERSION    ?= $(shell git describe --tags --always --dirty 2>/dev/null)
REVISION   ?= $(shell git rev-parse HEAD 2>/dev/null)
BUILD_DATE ?= $(shell date -u +%Y-%m-%dT%H:%M:%SZ)
BUILDINFO  := github.com/headwater-gitops/headwater/pkg/buildinfo
# STRIP drops the symbol and debug tables, as the images do; `make build
# STRIP=` keeps them, for perf(1) (pprof needs neither).
STRIP      ?= -s -w
buildinfo_ldflags = -X $(BUILDINFO).Version=$(VERSION) -X $(BUILDINFO).Revision=$(REVISION) -X $(BUILDINFO).BuildDate=$(1)
LDFLAGS    := $(call buildinfo_ldflags,$(BUILD_DATE))

# Images (`make images`, `make image-archive`; deploy/README.md), assembled
# by hack/imagebuild from the binaries cross-compiled into bin/<os>_<arch>/,
# without Docker. The same commit gives the same digests: SOURCE_DATE_EPOCH
# (the commit time) sets every file time, the created time and label, and
# the build date stamped into the binaries. REGISTRY=host:port/path pushes
# them there as well (REGISTRY_INSECURE=1 for plain HTTP).
IMAGE_REGISTRY    ?= ghcr.io/headwater-gitops
IMAGE_TAG         ?= v0.1.0
PLATFORMS         ?=
REGISTRY          ?=
REGISTRY_INSECURE ?=
THIRD_PARTY       ?= 1
SOURCE_DATE_EPOCH ?= $(shell git log -1 --format=%ct 2>/dev/null || echo 0)
IMAGES_DIR        := $(BIN_DIR)/images
IMAGE_BUILD_DATE  := $(shell date -u -d @$(SOURCE_DATE_EPOCH) +%Y-%m-%dT%H:%M:%SZ 2>/dev/null || date -u -r $(SOURCE_DATE_EPOCH) +%Y-%m-%dT%H:%M:%SZ)
IMAGE_LDFLAGS     := $(call buildinfo_ldflags,$(IMAGE_BUILD_DATE))
# The third-party images the manifests name, built here from Go modules:
# <kind>=<reference>@<binary> (hack/imagebuild -third-party).
THIRD_PARTY_IMAGES := \
	nats=docker.io/library/nats:$(NATS_SERVER_VERSION:v%=%)@$(NATS_SERVER) \
	minio=quay.io/minio/minio:RELEASE.2026-02-12T20-18-48Z@$(MINIO) \
	pause=registry.k8s.io/pause:3.10@$(BIN_DIR)/{os}_{arch}/pause \
	coredns=registry.k8s.io/coredns/coredns:$(COREDNS_VERSION)@$(COREDNS)
# Flux's controllers, under the names `flux install` uses, and what
# helm-controller does with a HelmChart's artifact (e2e/cmd/helmrelease:
# helm-controller's module is not served by the Go module proxy).
FLUX_IMAGES := \
	source-controller=ghcr.io/fluxcd/source-controller:$(FLUX_SOURCE_CONTROLLER_VERSION)@$(FLUX_SOURCE_CONTROLLER) \
	kustomize-controller=ghcr.io/fluxcd/kustomize-controller:$(FLUX_KUSTOMIZE_CONTROLLER_VERSION)@$(FLUX_KUSTOMIZE_CONTROLLER_DIR)/kustomize-controller \
	notification-controller=ghcr.io/fluxcd/notification-controller:$(FLUX_NOTIFICATION_CONTROLLER_VERSION)@$(FLUX_NOTIFICATION_CONTROLLER_DIR)/notification-controller \
	helmrelease=ghcr.io/headwater-gitops/e2e-helmrelease:test@$(BIN_DIR)/linux_amd64/helmrelease

##@ General

.PHONY: help
help: ## Show this help.
	@awk 'BEGIN {FS = ":.*##"; printf "Usage: make <target>\n"} \
		/^[a-zA-Z_0-9-]+:.*?##/ { printf "  %-14s %s\n", $$1, $$2 } \
		/^##@/ { printf "\n%s\n", substr($$0, 5) }' $(MAKEFILE_LIST)

##@ Run

.PHONY: run
run: build kube-tools ## Run the whole system on the embedded default (Ctrl-C stops it).
	$(BIN_DIR)/headwater-local -bin-dir $(BIN_DIR) -crd-dir $(CURDIR)/$(CRD_DIR) -receivers-crd-dir $(CURDIR)/$(RECEIVERS_DIR)/crd -httpsource-crd-dir $(CURDIR)/$(HTTPSOURCE_DIR)/crd

##@ Build

.PHONY: build
build: ## Build headwater, every service in one binary, as the image does (static, stripped, stamped with VERSION, REVISION, BUILD_DATE), a link to it per service, the local runner and headwater-nats into bin/.
	@mkdir -p $(BIN_DIR)
	@echo "==> version $(VERSION), revision $(REVISION)"
	@echo "==> building headwater ($(SERVICES))"
	@cd cmd/headwater && CGO_ENABLED=0 go build -trimpath -ldflags '$(STRIP) $(LDFLAGS)' -o $(BIN_DIR)/headwater .
	@# bin/<service> runs the role it is named after (what the tests and
	@# headwater-local start), from the one file, as on a node.
	@for s in $(SERVICES); do ln -f $(BIN_DIR)/headwater $(BIN_DIR)/$$s; done
	@echo "==> building headwater-local and headwater-nats"
	@cd e2e && go build -trimpath -o $(BIN_DIR)/headwater-local ./cmd/headwater-local
	@cd e2e && CGO_ENABLED=0 go build -trimpath -ldflags '$(STRIP)' -o $(BIN_DIR)/headwater-nats ./cmd/headwater-nats

.PHONY: images
images: ## Build the headwater image (every service; -target picks one) for PLATFORMS (linux/amd64,linux/arm64) into the OCI layout bin/images/oci, as IMAGE_REGISTRY/headwater:IMAGE_TAG; REGISTRY=host:port/path pushes it too.
	@$(call build_images,$(or $(PLATFORMS),linux/amd64$(comma)linux/arm64),-layout $(IMAGES_DIR)/oci $(if $(REGISTRY),-push $(REGISTRY)) $(if $(REGISTRY_INSECURE),-insecure),)

.PHONY: image-archive
image-archive: $(if $(THIRD_PARTY),minio nats-server coredns) ## Write bin/images/headwater-images.tar for `ctr images import`: headwater and (THIRD_PARTY=1) NATS, MinIO, pause and CoreDNS, for PLATFORMS (linux/amd64).
	@$(call build_images,$(or $(PLATFORMS),linux/amd64),-archive $(IMAGE_ARCHIVE),$(THIRD_PARTY))

comma := ,

# A release (deploy/README.md, "Releases"): into bin/release/, never
# committed, the images (an OCI layout archive, for PLATFORMS), the default
# install and the Flux drop-in in one file each with Headwater's image
# pinned to the version's tag and digest, the chart packaged with the
# version, digests.txt and checksums.txt.
RELEASE_DIR := $(BIN_DIR)/release

.PHONY: release
release: IMAGE_TAG = $(VERSION)
release: ## Write the release VERSION=vX.Y.Z into bin/release: images (headwater-images.tar, PLATFORMS default linux/amd64,linux/arm64), install.yaml, install-flux-system.yaml, headwater-X.Y.Z.tgz, digests.txt, checksums.txt.
	@if ! [[ "$(VERSION)" =~ ^v[0-9]+\.[0-9]+\.[0-9]+ ]]; then echo "make release VERSION=vX.Y.Z (VERSION is '$(VERSION)')"; exit 1; fi
	@rm -rf $(RELEASE_DIR) && mkdir -p $(RELEASE_DIR)
	@$(call build_images,$(or $(PLATFORMS),linux/amd64$(comma)linux/arm64),-archive $(RELEASE_DIR)/headwater-images.tar -digests $(RELEASE_DIR)/digests.txt,)
	@cd hack/chartgen && GOWORK=off go run . -root $(CURDIR) -release $(VERSION) -release-dir $(RELEASE_DIR) -digests $(RELEASE_DIR)/digests.txt
	@cd $(RELEASE_DIR) && cat checksums.txt

.PHONY: flux-image-archive
flux-image-archive: flux flux-controllers ## Write bin/images/flux-images.tar: Flux's source-, kustomize- and notification-controller (linux/amd64), which the full cluster tests run beside Headwater and switch from and back to, and the helmrelease Job (e2e/cmd/helmrelease).
	@mkdir -p $(IMAGES_DIR)
	@cd e2e && CGO_ENABLED=0 GOOS=linux GOARCH=amd64 go build -trimpath -ldflags '-s -w' -o $(BIN_DIR)/linux_amd64/helmrelease ./cmd/helmrelease
	@cd hack/imagebuild && GOWORK=off go build -trimpath -o $(BIN_DIR)/imagebuild .
	$(BIN_DIR)/imagebuild -platforms linux/amd64 -source-date-epoch $(SOURCE_DATE_EPOCH) \
		$(foreach i,$(FLUX_IMAGES),-third-party '$(i)') -archive $(FLUX_IMAGE_ARCHIVE)

# build_images <platforms> <imagebuild output flags> <third party?>:
# cross-compiles headwater (and the pause program) for each platform into
# bin/<os>_<arch>/ with the flags of `make build` and the build date of
# SOURCE_DATE_EPOCH, then assembles the images.
define build_images
	set -e; mkdir -p $(IMAGES_DIR); \
	echo "==> images $(IMAGE_TAG), version $(VERSION), revision $(REVISION), SOURCE_DATE_EPOCH $(SOURCE_DATE_EPOCH), platforms $(1)"; \
	for p in $(subst $(comma), ,$(1)); do \
		os=$${p%%/*}; arch=$${p#*/}; arch=$${arch%%/*}; \
		echo "==> building headwater for $$os/$$arch"; \
		(cd cmd/headwater && CGO_ENABLED=0 GOOS=$$os GOARCH=$$arch go build -trimpath -ldflags '$(STRIP) $(IMAGE_LDFLAGS)' -o $(BIN_DIR)/$${os}_$$arch/headwater .); \
		$(if $(3),(cd hack/imagebuild && GOWORK=off CGO_ENABLED=0 GOOS=$$os GOARCH=$$arch go build -trimpath -ldflags '-s -w' -o $(BIN_DIR)/$${os}_$$arch/pause ./pause);) \
	done; \
	(cd hack/imagebuild && GOWORK=off go build -trimpath -o $(BIN_DIR)/imagebuild .); \
	$(BIN_DIR)/imagebuild -platforms $(1) -source-date-epoch $(SOURCE_DATE_EPOCH) \
		-version '$(VERSION)' -revision '$(REVISION)' -registry $(IMAGE_REGISTRY) -tag $(IMAGE_TAG) \
		-service headwater=$(BIN_DIR)/{os}_{arch}/headwater \
		$(if $(3),$(foreach i,$(THIRD_PARTY_IMAGES),-third-party '$(i)')) $(2)
endef

.PHONY: tools
tools: kube-tools minio bucket-emulators registry controller-gen ## Build and cache every real component used by tests.

.PHONY: kube-tools
kube-tools: ## kube-apiserver, etcd and kubectl for envtest (cached).
	@hack/build-tools.sh $(TOOLS_DIR) kube etcd
	@mkdir -p $(KUBEBUILDER_ASSETS)
	@ln -sf $(TOOLS_DIR)/kube-$(KUBE_VERSION)/kube-apiserver $(KUBEBUILDER_ASSETS)/kube-apiserver
	@ln -sf $(TOOLS_DIR)/kube-$(KUBE_VERSION)/kubectl $(KUBEBUILDER_ASSETS)/kubectl
	@ln -sf $(TOOLS_DIR)/etcd-$(ETCD_VERSION)/etcd $(KUBEBUILDER_ASSETS)/etcd

.PHONY: kube-node
kube-node: ## kubelet, kube-proxy, kube-scheduler and kube-controller-manager for the cluster tests (cached).
	@hack/build-tools.sh $(TOOLS_DIR) kube-node

.PHONY: cluster-deps
cluster-deps: ## containerd, runc, the CNI plugins and iptables from Debian's packages, when missing (as root).
	@hack/cluster-deps.sh

.PHONY: minio
minio: ## The MinIO server for S3 tests (cached).
	@hack/build-tools.sh $(TOOLS_DIR) minio

.PHONY: bucket-emulators
bucket-emulators: fake-gcs-server azurite ## The emulators of the gcp and azure Bucket providers' tests (cached).

.PHONY: fake-gcs-server
fake-gcs-server: ## fake-gcs-server, the Google Cloud Storage emulator for gcp Bucket tests (cached).
	@hack/build-tools.sh $(TOOLS_DIR) fake-gcs-server

.PHONY: azurite
azurite: ## Azurite, the Azure Blob Storage emulator for azure Bucket tests, from the npm registry (needs node; cached).
	@hack/build-tools.sh $(TOOLS_DIR) azurite

.PHONY: registry
registry: ## The CNCF distribution registry for OCI tests (cached).
	@hack/build-tools.sh $(TOOLS_DIR) registry

.PHONY: nats-server
nats-server: ## The NATS server of the nats image (cached).
	@hack/build-tools.sh $(TOOLS_DIR) nats-server

.PHONY: coredns
coredns: ## CoreDNS with a cluster DNS's plugins, for the coredns image (cached).
	@hack/build-tools.sh $(TOOLS_DIR) coredns

.PHONY: controller-gen
controller-gen:
	@hack/build-tools.sh $(TOOLS_DIR) controller-gen

##@ Generate

.PHONY: generate
generate: manifests chart ## Generate everything generated (CRDs, RBAC, the Helm chart).

.PHONY: manifests
manifests: controller-gen ## Generate the CRDs (from the Flux API modules, source-watcher's included, and pkg/apis), the deepcopy code of pkg/apis, the RBAC (from markers) and NATS's authorization (from pkg/events) into deploy/.
	@rm -rf $(CRD_DIR) && mkdir -p $(CRD_DIR)
	cd pkg && $(CONTROLLER_GEN) crd paths=github.com/fluxcd/source-controller/api/v1 output:crd:artifacts:config=$(CURDIR)/$(CRD_DIR)
	cd pkg && $(CONTROLLER_GEN) crd paths=github.com/fluxcd/source-watcher/api/v2/v1beta1 output:crd:artifacts:config=$(CURDIR)/$(CRD_DIR)
	cd pkg && $(CONTROLLER_GEN) object paths=./apis/...
	cd pkg && $(CONTROLLER_GEN) crd paths=./apis/... output:crd:artifacts:config=$(CURDIR)/$(CRD_DIR)
	@$(MAKE) --no-print-directory crds-kustomization
	cd services/watcher && $(CONTROLLER_GEN) rbac:roleName=headwater-watcher paths="{./internal/controller/...,./internal/subscriptions/...,./internal/fluxguard/...,./internal/externalartifact/...,./internal/generator/...}" output:rbac:artifacts:config=$(CURDIR)/$(RBAC_DIR)/watcher
	cd services/fetcher && $(CONTROLLER_GEN) rbac:roleName=headwater-fetcher paths=./... output:rbac:artifacts:config=$(CURDIR)/$(RBAC_DIR)/fetcher
	cd services/dispatcher && $(CONTROLLER_GEN) rbac:roleName=headwater-dispatcher paths=./... output:rbac:artifacts:config=$(CURDIR)/deploy/components/dispatcher/rbac
	@# The receivers component: Flux's Receiver CRD (from the notification-controller API module), the watcher's extra role and the receiver's.
	@rm -rf $(RECEIVERS_DIR)/crd && mkdir -p $(RECEIVERS_DIR)/crd
	cd services/receiver && $(CONTROLLER_GEN) crd paths=github.com/fluxcd/notification-controller/api/v1 output:crd:artifacts:config=$(CURDIR)/$(RECEIVERS_DIR)/crd
	cd services/watcher && $(CONTROLLER_GEN) rbac:roleName=headwater-watcher-receivers paths=./internal/receiver/... output:rbac:artifacts:config=$(CURDIR)/$(RECEIVERS_DIR)/rbac/watcher
	cd services/receiver && $(CONTROLLER_GEN) rbac:roleName=headwater-receiver paths=./... output:rbac:artifacts:config=$(CURDIR)/$(RECEIVERS_DIR)/rbac/receiver
	@# The httpsource component: the HTTPSource CRD (plug-in kind example) and its deepcopy code, from services/httpsource-fetcher/api.
	@rm -rf $(HTTPSOURCE_DIR)/crd && mkdir -p $(HTTPSOURCE_DIR)/crd
	cd services/httpsource-fetcher && $(CONTROLLER_GEN) object paths=./api/... && $(CONTROLLER_GEN) crd paths=./api/... output:crd:artifacts:config=$(CURDIR)/$(HTTPSOURCE_DIR)/crd
	cd e2e && go run ./cmd/headwater-nats config > $(CURDIR)/deploy/base/nats/auth.conf
	cd e2e && go run ./cmd/headwater-nats config -plugin-kinds HTTPSource > $(CURDIR)/$(HTTPSOURCE_DIR)/nats/auth.conf

# The Helm chart is generated from deploy/ (docs/design.md, "One truth for
# kustomize and Helm"): hack/chartgen renders every combination of the
# chart's choices with kustomize and writes templates that render the
# same; its tests compare the two.
.PHONY: chart
chart: ## Generate charts/headwater from deploy/ (hack/chartgen).
	cd hack/chartgen && GOWORK=off go run . -root $(CURDIR) -out $(CURDIR)/charts/headwater

# deploy/crds/kustomization.yaml lists every generated CRD, so that deploy/
# and the overlays include the directory (kustomize takes no loose files
# from outside a kustomization's own directory).
.PHONY: crds-kustomization
crds-kustomization:
	@crds=$$(cd $(CRD_DIR) && LC_ALL=C ls *.yaml | grep -vx kustomization.yaml); \
	{ \
		echo '# Generated by `make manifests`: do not edit. The CRDs Headwater serves'; \
		echo '# (the Flux source API, generated from github.com/fluxcd/source-controller/api,'; \
		echo '# and the ArtifactGenerator, from github.com/fluxcd/source-watcher/api)'; \
		echo '# and its own (events.headwater.dev, from pkg/apis), as one kustomization'; \
		echo '# that deploy/ and the overlays include.'; \
		echo 'apiVersion: kustomize.config.k8s.io/v1beta1'; \
		echo 'kind: Kustomization'; \
		echo; \
		echo 'resources:'; \
		for f in $$crds; do echo "  - $$f"; done; \
	} > $(CRD_DIR)/kustomization.yaml

##@ Test

# `make test` runs every step to the end (make lint first, so CI sees an
# unformatted file or a vet finding), even past a failing one, and
# then fails listing the steps that failed: one red package does not hide
# the state of the others (the node test above all).
.PHONY: test
test: $(TEST_TOOLS) ## Run make lint and every test: unit, integration, fuzz (short) and end-to-end, the node test included; lists what failed at the end.
	@failed=(); \
	$(MAKE) --no-print-directory lint || failed+=("make lint"); \
	for m in $(MODULES); do \
		echo "==> go test $$m"; \
		(cd $$m && go test $(GO_TEST_FLAGS) ./...) || failed+=("go test $$m"); \
	done; \
	for m in $(HACK_MODULES); do \
		echo "==> go test $$m"; \
		(cd $$m && GOWORK=off go test $(GO_TEST_FLAGS) ./...) || failed+=("go test $$m"); \
	done; \
	$(MAKE) --no-print-directory fuzz FUZZTIME=$(FUZZ_SHORT) || failed+=("make fuzz"); \
	$(MAKE) --no-print-directory test-cluster CLUSTER_TESTS=short || failed+=("make test-cluster CLUSTER_TESTS=short"); \
	if [ $${#failed[@]} -gt 0 ]; then \
		echo "==> make test: $${#failed[@]} step(s) failed:"; printf '    %s\n' "$${failed[@]}"; exit 1; \
	fi; \
	echo "==> make test: every step passed"

# `make test-fresh` runs `make test` as a new machine would: an empty tools
# cache, bin/ and Go build cache (in FRESH_DIR, removed afterwards; the Go
# module cache is kept: it holds downloads, not builds), and prints how long
# it took. Run it before resolving an issue that adds a tool.
FRESH_DIR ?= $(shell mktemp -d -u /tmp/headwater-fresh.XXXXXX)

.PHONY: test-fresh
test-fresh: ## Run `make test` with an empty tools cache, bin/ and Go build cache (as a new machine does) and print its time.
	@echo "==> make test on a fresh tools cache, bin/ and build cache in $(FRESH_DIR)"
	@mkdir -p $(FRESH_DIR); start=$$(date +%s); rc=0; \
	$(MAKE) --no-print-directory test TOOLS_DIR=$(FRESH_DIR)/tools BIN_DIR=$(FRESH_DIR)/bin GOCACHE=$(FRESH_DIR)/go-build || rc=$$?; \
	echo "==> make test-fresh: exit $$rc after $$(( ($$(date +%s) - start) / 60 )) min $$(( ($$(date +%s) - start) % 60 )) s"; \
	chmod -R u+w $(FRESH_DIR); rm -rf $(FRESH_DIR); exit $$rc

# test-tools prints TEST_TOOLS; test-env what the Makefile exports to the
# tests, NAME=VALUE a line (hack/verify-test-tools.sh reads both).
.PHONY: test-tools test-env
test-tools:
	@echo $(TEST_TOOLS)
test-env:
	@$(foreach v,$(sort KUBEBUILDER_ASSETS $(filter HEADWATER_%,$(.VARIABLES))),$(if $(filter environment%,$(origin $(v))),,echo '$(v)=$($(v))';))

# CLUSTER_TESTS: short (what `make test` runs: the default install, one
# GitRepository, fetchers scaled up; skipped, saying why, where the machine
# cannot run a node) or full (every overlay, load, faults, bad input).
CLUSTER_TESTS ?= full

# What TestFluxControllers imports and applies (make flux-image-archive):
# only the full cluster tests need (and build) it.
test-cluster: export HEADWATER_FLUX_IMAGES := $(if $(filter full,$(CLUSTER_TESTS)),$(FLUX_IMAGE_ARCHIVE))
test-cluster: export HEADWATER_FLUX_CRDS := $(FLUX_KUSTOMIZE_CONTROLLER_DIR)/crds$(if $(filter full,$(CLUSTER_TESTS)),:$(FLUX_NOTIFICATION_CONTROLLER_DIR)/crds)

.PHONY: test-cluster
test-cluster: kube-tools kube-node cluster-deps image-archive $(if $(filter full,$(CLUSTER_TESTS)),flux-image-archive) ## Run Headwater's images on a real single-node cluster (containerd, kubelet, kube-proxy, DNS) through deploy/ as shipped: every overlay, scaling, faults, bad input (root).
	cd e2e && HEADWATER_CLUSTER=$(CLUSTER_TESTS) go test $(GO_TEST_FLAGS) -v -timeout 80m ./clustertest/

# MULTINODE_NODES: how many nodes `make test-multinode` runs (each a network
# namespace with its own kubelet, kube-proxy and containerd).
MULTINODE_NODES ?= 3

.PHONY: test-multinode
test-multinode: kube-tools kube-node cluster-deps image-archive ## Run Headwater on a real cluster of three nodes on this machine (a bridge joins them): the pod network across nodes, the HA overlay, a node lost and one drained under load (root; not part of make test).
	cd e2e && HEADWATER_CLUSTER_NODES=$(MULTINODE_NODES) go test $(GO_TEST_FLAGS) -v -timeout 90m ./multinodetest/

.PHONY: fuzz
fuzz: ## Fuzz the archive writer and merger, event decoding, ignore rules, revisions and Helm indexes (FUZZTIME executions each; default 500000x).
	@for t in $(FUZZ_TARGETS); do \
		IFS=: read -r dir pkg target <<< "$$t"; \
		echo "==> fuzz $$dir $$pkg $$target for $(FUZZTIME)"; \
		(cd $$dir && go test -run '^$$' -fuzz "^$$target\$$" -fuzztime $(FUZZTIME) $$pkg) || exit 1; \
	done

# The fault suite's load for `make test-faults`: sources per storage, the
# repositories they are spread over, rounds of each fault. `make test` runs
# it small (40 sources over 8 repositories, one round, both storages at once).
FAULT_SOURCES ?= 300
FAULT_REPOS   ?= 30
FAULT_ROUNDS  ?= 2

.PHONY: test-faults
test-faults: kube-tools minio build ## kill -9 each service and NATS mid-job under FAULT_SOURCES sources (300), on directory storage and MinIO; print a table.
	cd e2e && go test $(GO_TEST_FLAGS) -v -run '^TestFaultSuite$$' -timeout 120m . \
		-args -fault-sources $(FAULT_SOURCES) -fault-repos $(FAULT_REPOS) -fault-rounds $(FAULT_ROUNDS) -fault-sequential

.PHONY: test-unit
test-unit: ## Run the tests that need no built tools (fast).
	@for m in $(MODULES); do (cd $$m && go test -short $(GO_TEST_FLAGS) ./...) || exit 1; done

.PHONY: bench
bench: kube-tools registry minio build flux ## Run every scenario on Headwater and on Flux's source-controller side by side and print a table (BENCH_SCENARIOS='a|d' runs some).
	cd e2e && go test -run '^$$' -bench '^BenchmarkSources$$' -benchtime 1x -timeout 200m ./bench/ \
		-args -flux-bin $(FLUX_SOURCE_CONTROLLER) -scenarios '$(BENCH_SCENARIOS)'

.PHONY: flux
flux: ## Flux's source-controller, built from its module for the side-by-side benchmark (cached).
	@hack/build-tools.sh $(TOOLS_DIR) flux

.PHONY: flux-kustomize-controller
flux-kustomize-controller: ## Flux's kustomize-controller alone, which `make test` runs against ExternalArtifacts (cached).
	@hack/build-tools.sh $(TOOLS_DIR) kustomize-controller

.PHONY: flux-controllers
flux-controllers: ## Flux's kustomize- and notification-controller, built from their modules for the cluster tests (cached).
	@hack/build-tools.sh $(TOOLS_DIR) kustomize-controller notification-controller

##@ Quality

.PHONY: lint
lint: ## gofmt -l (nothing may be listed) and go vet every module.
	@echo "==> gofmt -l"; out=$$(gofmt -l $(MODULES) $(HACK_MODULES) hack/tools); \
		if [ -n "$$out" ]; then echo "not gofmt'ed:"; echo "$$out"; exit 1; fi
	@for m in $(MODULES); do echo "==> go vet $$m"; (cd $$m && go vet ./...) || exit 1; done
	@for m in $(HACK_MODULES); do echo "==> go vet $$m"; (cd $$m && GOWORK=off go vet ./...) || exit 1; done

.PHONY: verify
verify: manifests chart ## Check generated files (the chart too), go.mod tidiness, one dependency resolution, and that `make test` builds every tool its tests start.
	@hack/verify.sh
	@hack/verify-test-tools.sh

.PHONY: clean
clean: ## Remove build output (the tools cache stays).
	rm -rf $(BIN_DIR)
