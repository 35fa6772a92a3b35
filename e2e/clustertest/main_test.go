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
	"testing"
	"time"

	"github.com/go-logr/logr"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/headwater-gitops/headwater/e2e/cluster"
	"github.com/headwater-gitops/headwater/e2e/cluster/kubetest"
)

var verbose = flag.Bool("cluster-log", false, "Stream the node's components' output.")

// full is whether HEADWATER_CLUSTER asks for everything.
var full = os.Getenv("HEADWATER_CLUSTER") == "full"

// env is the cluster every test of the package shares, and the git server
// its sources fetch from.
var env struct {
	*kubetest.Env
	skip string // why the tests skip, when the machine cannot run a node
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
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	e, err := kubetest.Start(ctx, o, *verbose)
	if err != nil {
		fmt.Fprintln(os.Stderr, "clustertest:", err)
		return 1
	}
	defer e.Stop()
	env.Env = e
	return m.Run()
}

// requireCluster skips t when the machine cannot run a node.
func requireCluster(t *testing.T) *cluster.Cluster {
	t.Helper()
	if env.skip != "" {
		t.Skip(env.skip)
	}
	return env.C
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
