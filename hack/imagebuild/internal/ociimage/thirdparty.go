package ociimage

import (
	"fmt"
	"sort"
	"strings"
	"time"
)

// thirdParty describes an image the Kubernetes manifests name that is not
// Headwater's own, rebuilt here from its Go module so nothing is pulled.
type thirdParty struct {
	path, user, title, description, source, licenses string
	env                                              []string
}

// thirdParties are the kinds ThirdPartySpec knows. Each puts its binary
// where the upstream image does and runs as the upstream image does.
var thirdParties = map[string]thirdParty{
	// The official nats image is the server on scratch, run as root (the
	// manifests pick the uid); they pass --config.
	"nats": {path: "/nats-server", title: "nats", description: "NATS server, built from github.com/nats-io/nats-server/v2",
		source: "https://github.com/nats-io/nats-server", licenses: "Apache-2.0"},
	"minio": {path: "/usr/bin/minio", title: "minio", description: "MinIO object storage, built from github.com/minio/minio",
		source: "https://github.com/minio/minio", licenses: "AGPL-3.0-or-later"},
	// The pod sandbox: registry.k8s.io/pause runs as 65535.
	"pause": {path: "/pause", user: "65535:65535", title: "pause", description: "Pod sandbox: waits for a signal and reaps zombies (hack/imagebuild/pause)",
		source: Source},
	"coredns": {path: "/coredns", user: "65532:65532", title: "coredns", description: "CoreDNS with the plugins a cluster DNS needs (hack/tools/coredns)",
		source: "https://github.com/coredns/coredns", licenses: "Apache-2.0"},
	// Flux's controllers run the cluster tests' consumers of Headwater's
	// artifacts and Events, and the source-controller it replaces
	// (e2e/clustertest): their images put the binary
	// in /usr/local/bin and run it as 65534 (Flux's Dockerfiles; the
	// alpine base, tini, git and gnupg are left out: the controllers link
	// what they use).
	"kustomize-controller": {path: "/usr/local/bin/kustomize-controller", user: "65534:65534", env: []string{"GNUPGHOME=/tmp"},
		title: "kustomize-controller", description: "Flux's kustomize-controller, built from github.com/fluxcd/kustomize-controller",
		source: "https://github.com/fluxcd/kustomize-controller", licenses: "Apache-2.0"},
	"notification-controller": {path: "/usr/local/bin/notification-controller", user: "65534:65534",
		title: "notification-controller", description: "Flux's notification-controller, built from github.com/fluxcd/notification-controller",
		source: "https://github.com/fluxcd/notification-controller", licenses: "Apache-2.0"},
	// What helm-controller does with a HelmChart's artifact, written with
	// the Helm v3 SDK (e2e/cmd/helmrelease): helm-controller's module is
	// not served by the Go module proxy these images are built from.
	"helmrelease": {path: "/usr/local/bin/helmrelease", user: "65534:65534", env: []string{"HELM_CACHE_HOME=/tmp", "HELM_CONFIG_HOME=/tmp", "HELM_DATA_HOME=/tmp"},
		title: "helmrelease", description: "Installs a Helm release from a HelmChart's artifact as helm-controller does (e2e/cmd/helmrelease)",
		source: Source},
	// Flux's own source-controller, which the migration test switches
	// from and back to (e2e/clustertest, TestFluxMigration).
	"source-controller": {path: "/usr/local/bin/source-controller", user: "65534:65534",
		title: "source-controller", description: "Flux's source-controller, built from github.com/fluxcd/source-controller",
		source: "https://github.com/fluxcd/source-controller", licenses: "Apache-2.0"},
}

// ThirdPartyKinds lists the kinds ThirdPartySpec accepts, sorted.
func ThirdPartyKinds() []string {
	kinds := make([]string, 0, len(thirdParties))
	for k := range thirdParties {
		kinds = append(kinds, k)
	}
	sort.Strings(kinds)
	return kinds
}

// ThirdPartySpec is the image of kind (see ThirdPartyKinds) named ref,
// wrapping binary. Its version label is ref's tag.
func ThirdPartySpec(kind, ref, binary string, created time.Time) (Spec, error) {
	tp, ok := thirdParties[kind]
	if !ok {
		return Spec{}, fmt.Errorf("third-party image kind %q: want one of %s", kind, strings.Join(ThirdPartyKinds(), ", "))
	}
	labels := map[string]string{
		"org.opencontainers.image.title":       tp.title,
		"org.opencontainers.image.description": tp.description,
		"org.opencontainers.image.source":      tp.source,
		"org.opencontainers.image.version":     refTag(ref),
		"org.opencontainers.image.created":     created.UTC().Format(time.RFC3339),
	}
	if tp.licenses != "" {
		labels["org.opencontainers.image.licenses"] = tp.licenses
	}
	return Spec{Ref: ref, Binary: binary, Path: tp.path, User: tp.user, Env: tp.env, Labels: labels}, nil
}

// refTag is the tag of a reference, "" without one.
func refTag(ref string) string {
	i := strings.LastIndex(ref, ":")
	if i < 0 || strings.Contains(ref[i:], "/") {
		return ""
	}
	return ref[i+1:]
}
