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
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/go-logr/logr"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/headwater-gitops/headwater/e2e/cluster"
	"github.com/headwater-gitops/headwater/testsupport/gitserver"
)

var verbose = flag.Bool("cluster-log", false, "Stream the nodes' components' output.")

// env is the cluster every test of the package shares, and the git server
// its sources fetch from.
var env struct {
	c       *cluster.Cluster
	git     *gitserver.Server
	gitRoot string
	deploy  string // the repository's deploy/ directory
	skip    string // why the tests skip
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
	if err := o.Available(); err != nil {
		fmt.Fprintln(os.Stderr, "multinodetest:", err)
		return 1
	}
	if *verbose {
		o.Log = os.Stderr
	} else {
		o.Log = progressOnly{}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	start := time.Now()
	c, err := cluster.Start(ctx, o)
	if err != nil {
		fmt.Fprintln(os.Stderr, "multinodetest: start the cluster:", err)
		return 1
	}
	defer c.Stop()
	fmt.Fprintf(os.Stderr, "multinodetest: %d nodes Ready with cluster DNS in %s\n", nodes, time.Since(start).Round(100*time.Millisecond))
	env.c = c
	if err := c.ImportProbe(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "multinodetest:", err)
		return 1
	}
	dir, err := os.MkdirTemp("", "headwater-multinodetest")
	if err != nil {
		fmt.Fprintln(os.Stderr, "multinodetest:", err)
		return 1
	}
	defer os.RemoveAll(dir)
	env.gitRoot = filepath.Join(dir, "git")
	env.git = &gitserver.Server{Root: env.gitRoot}
	if err := env.git.Start(c.HostIP + ":0"); err != nil {
		fmt.Fprintln(os.Stderr, "multinodetest:", err)
		return 1
	}
	defer env.git.Stop()
	wd, err := os.Getwd()
	if err != nil {
		fmt.Fprintln(os.Stderr, "multinodetest:", err)
		return 1
	}
	env.deploy = filepath.Join(wd, "..", "..", "deploy")
	return m.Run()
}

// requireCluster skips t when no cluster runs.
func requireCluster(t *testing.T) *cluster.Cluster {
	t.Helper()
	if env.skip != "" {
		t.Skip(env.skip)
	}
	return env.c
}

// progressOnly prints the harness's own progress lines, not the
// components' output.
type progressOnly struct{}

func (progressOnly) Write(p []byte) (int, error) {
	if len(p) > 0 && p[0] != '[' {
		os.Stderr.Write(p)
	}
	return len(p), nil
}
