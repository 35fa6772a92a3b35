// Command coredns is CoreDNS built with only the plugins a cluster DNS needs:
// those of the Corefile kubeadm writes (errors, health, ready, kubernetes,
// prometheus, forward, cache, loop, reload, loadbalance) plus log, and
// whoami, which CoreDNS serves when it is given no Corefile. hack/build-tools.sh
// builds it for the registry.k8s.io/coredns/coredns image that
// hack/imagebuild assembles; the version is pinned by this module's go.mod.
package main

import (
	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/coremain"

	// The plugins, each registering itself with dnsserver.
	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/forward"
	_ "github.com/coredns/coredns/plugin/health"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/loadbalance"
	_ "github.com/coredns/coredns/plugin/log"
	_ "github.com/coredns/coredns/plugin/loop"
	_ "github.com/coredns/coredns/plugin/metrics"
	_ "github.com/coredns/coredns/plugin/ready"
	_ "github.com/coredns/coredns/plugin/reload"
	_ "github.com/coredns/coredns/plugin/whoami"
)

// directives are the plugins above in the order CoreDNS's own
// core/dnsserver/zdirectives.go runs them: a plugin sees every request
// before those after it.
var directives = []string{
	"reload",
	"ready",
	"health",
	"prometheus",
	"errors",
	"log",
	"loadbalance",
	"cache",
	"kubernetes",
	"loop",
	"forward",
	"whoami",
}

func init() {
	dnsserver.Directives = directives
}

func main() {
	coremain.Run()
}
