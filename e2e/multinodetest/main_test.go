// Package multinodetest runs Headwater on a real cluster of three nodes on
// this machine (package cluster with Options.Nodes = 3): each node a network
// namespace of its own with its own kubelet, kube-proxy and containerd, a
// bridge joining them, one control plane. It proves what the single-node
// tests cannot: that the pod network spans the nodes, and (the fault tests)
// that losing a node loses nothing.
//
// HEADWATER_CLUSTER_NODES chooses whether it runs: unset, nothing (a plain
// `go test ./...` and `make test` start no cluster); a number (what `make
// test-multinode` sets, 3), the cluster of that many nodes, failing on a
// machine that cannot run one.
package multinodetest

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/go-logr/logr"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/headwater-gitops/headwater/e2e/cluster"
	"github.com/headwater-gitops/headwater/e2e/cluster/kubetest"
)

var verbose = flag.Bool("cluster-log", false, "Stream the nodes' components' output.")

// env is the cluster every test of the package shares, and the git server
// its sources fetch from.
var env struct {
	*kubetest.Env
	skip string // why the tests skip
}

func TestMain(m *testing.M) {
	flag.Parse()
	ctrllog.SetLogger(logr.FromSlogHandler(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError})))
	os.Exit(run(m))
}

func run(m *testing.M) int {
	v := os.Getenv("HEADWATER_CLUSTER_NODES")
	if v == "" {
		env.skip = "HEADWATER_CLUSTER_NODES is not set: make test-multinode runs these tests"
		return m.Run()
	}
	nodes, err := strconv.Atoi(v)
	if err != nil || nodes < 2 {
		fmt.Fprintf(os.Stderr, "multinodetest: HEADWATER_CLUSTER_NODES=%q: want a number of nodes, 2 or more\n", v)
		return 1
	}
	o := cluster.FromEnv()
	o.Nodes = nodes
	// Every write of Headwater's service accounts, for TestNodeLoss's
	// check of who wrote (audit_test.go).
	o.AuditPolicy = auditPolicy
	if err := o.Available(); err != nil {
		fmt.Fprintln(os.Stderr, "multinodetest:", err)
		return 1
	}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	e, err := kubetest.Start(ctx, o, *verbose)
	if err != nil {
		fmt.Fprintln(os.Stderr, "multinodetest:", err)
		return 1
	}
	defer e.Stop()
	env.Env = e
	return m.Run()
}

// requireCluster skips t when no cluster runs.
func requireCluster(t *testing.T) *cluster.Cluster {
	t.Helper()
	if env.skip != "" {
		t.Skip(env.skip)
	}
	return env.C
}
