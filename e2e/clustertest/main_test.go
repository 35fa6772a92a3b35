// Package clustertest runs Headwater the way users run it: the images
// `make image-archive` builds, applied with `kubectl apply -k` from deploy/
// onto a real single-node Kubernetes cluster (package cluster), and driven
// only through the cluster's API and in-cluster Services.
//
// HEADWATER_CLUSTER chooses what runs: unset, nothing (a plain `go test
// ./...` starts no node); "short", the short form `make test` runs (the
// default install, one GitRepository, fetchers scaled up), skipped with what
// is missing on a machine that cannot run a node; "full", what `make
// test-cluster` runs: every overlay, load, faults and bad input, failing on a
// machine that cannot run a node.
package clustertest

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/go-logr/logr"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/headwater-gitops/headwater/e2e/cluster"
	"github.com/headwater-gitops/headwater/testsupport/gitserver"
)

var verbose = flag.Bool("cluster-log", false, "Stream the node's components' output.")

// full is whether HEADWATER_CLUSTER asks for everything.
var full = os.Getenv("HEADWATER_CLUSTER") == "full"

// env is the cluster every test of the package shares, and the git server
// its sources fetch from.
var env struct {
	c        *cluster.Cluster
	git      *gitserver.Server
	gitRoot  string
	repoRoot string
	deploy   string // the repository's deploy/ directory
	// kustomizations holds the kustomizations deployPath writes over
	// deploy/'s.
	kustomizations string
	skip           string // why the tests skip, when the machine cannot run a node
}

func TestMain(m *testing.M) {
	flag.Parse()
	// The tests' clients log errors only (controller-runtime prints a
	// stack when no logger is set).
	ctrllog.SetLogger(logr.FromSlogHandler(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError})))
	os.Exit(run(m))
}

func run(m *testing.M) int {
	mode := os.Getenv("HEADWATER_CLUSTER")
	if mode == "" {
		env.skip = "HEADWATER_CLUSTER is not set: make test runs these tests (short), make test-cluster all of them (full)"
		return m.Run()
	}
	o := cluster.FromEnv()
	if err := o.Available(); err != nil {
		if mode == "full" {
			fmt.Fprintln(os.Stderr, "clustertest:", err)
			return 1
		}
		fmt.Fprintln(os.Stderr, "clustertest: skipped:", err)
		env.skip = err.Error()
		return m.Run()
	}
	if *verbose {
		o.Log = os.Stderr
	} else {
		o.Log = progressOnly{}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	start := time.Now()
	c, err := cluster.Start(ctx, o)
	if err != nil {
		fmt.Fprintln(os.Stderr, "clustertest: start the node:", err)
		return 1
	}
	defer c.Stop()
	fmt.Fprintf(os.Stderr, "clustertest: node Ready with cluster DNS in %s\n", time.Since(start).Round(100*time.Millisecond))
	env.c = c
	if err := c.ImportProbe(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "clustertest:", err)
		return 1
	}
	dir, err := os.MkdirTemp("", "headwater-clustertest")
	if err != nil {
		fmt.Fprintln(os.Stderr, "clustertest:", err)
		return 1
	}
	defer os.RemoveAll(dir)
	env.gitRoot = filepath.Join(dir, "git")
	env.repoRoot = filepath.Join(dir, "work")
	env.git = &gitserver.Server{Root: env.gitRoot}
	if err := env.git.Start(c.HostIP + ":0"); err != nil {
		fmt.Fprintln(os.Stderr, "clustertest:", err)
		return 1
	}
	defer env.git.Stop()
	wd, err := os.Getwd()
	if err != nil {
		fmt.Fprintln(os.Stderr, "clustertest:", err)
		return 1
	}
	env.deploy = filepath.Join(wd, "..", "..", "deploy")
	env.kustomizations = filepath.Join(dir, "kustomizations")
	return m.Run()
}

// requireCluster skips t when the machine cannot run a node.
func requireCluster(t *testing.T) *cluster.Cluster {
	t.Helper()
	if env.skip != "" {
		t.Skip(env.skip)
	}
	return env.c
}

// requireFull skips t unless -cluster-full.
func requireFull(t *testing.T) *cluster.Cluster {
	t.Helper()
	c := requireCluster(t)
	if !full {
		t.Skip("part of make test-cluster (HEADWATER_CLUSTER=full)")
	}
	return c
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
