package bench

import (
	"flag"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/headwater-gitops/headwater/e2e/harness"
)

var (
	manySmallRuns = flag.Int("many-small-runs", 1, "How many times scenario a (and d after it) runs, each on a fresh Env.")
	serviceArgs   = flag.String("service-args", "",
		"Service flags added for an experiment, space-separated <service>:<flag>, e.g. 'fetcher:-concurrency=8'.")
)

// BenchmarkSources runs every scenario once, each on a fresh Env, and
// prints the comparison table. Run it with `make bench` (which builds the
// services and the control-plane binaries first):
//
//	go test -run '^$' -bench . -benchtime 1x -timeout 30m ./bench/ [-args -many-small-runs 2]
func BenchmarkSources(b *testing.B) {
	o, err := options()
	if err != nil {
		b.Fatal(err)
	}
	if o.Harness.ExtraArgs, err = parseServiceArgs(*serviceArgs); err != nil {
		b.Fatal(err)
	}
	ctrllog.SetLogger(logr.FromSlogHandler(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError})))

	var rows []Row
	for i := range *manySmallRuns {
		suffix := ""
		if *manySmallRuns > 1 {
			suffix = fmt.Sprintf(" (run %d)", i+1)
		}
		aName := "a. 1000 GitRepositories over 10 small repositories" + suffix
		dName := "d. steady state: reconcile request to all 1000 (unchanged)" + suffix
		b.Run(fmt.Sprintf("many-small-run-%d", i+1), func(b *testing.B) {
			created, requested, err := ManySmall(b.Context(), o)
			rows = append(rows, row(aName, FluxManySmall, created, err), row(dName, Reference{}, requested, err))
			if err != nil {
				b.Fatal(err)
			}
			report(b, created)
		})
	}
	b.Run("large-tree", func(b *testing.B) {
		m, err := LargeTree(b.Context(), o)
		rows = append(rows, row("b. one repository with a 256 MiB tree", FluxLargeTree, m, err))
		if err != nil {
			b.Fatal(err)
		}
		report(b, m)
	})
	b.Run("helm-index", func(b *testing.B) {
		m, err := HelmIndex(b.Context(), o)
		rows = append(rows, row("c. one 48 MiB Helm index, then one HelmChart", FluxHelmIndex, m, err))
		if err != nil {
			b.Fatal(err)
		}
		report(b, m)
	})
	b.Run("many-oci", func(b *testing.B) {
		m, err := ManyOCI(b.Context(), o, b)
		rows = append(rows, row("e. 1000 OCIRepositories over 10 artifacts (Flux: its own benchmark, 16 cores, not side by side)", FluxManyOCI, m, err))
		if err != nil {
			b.Fatal(err)
		}
		report(b, m)
	})
	b.Run("helm-same-url", func(b *testing.B) {
		created, requested, err := HelmSameURL(b.Context(), o)
		rows = append(rows, row("f. 100 HelmRepositories of one URL", Reference{}, created, err),
			row("f'. reconcile request to all 100 (index unchanged)", Reference{}, requested, err))
		if err != nil {
			b.Fatal(err)
		}
		report(b, created)
	})
	WriteTable(os.Stdout, rows)
	if *serviceArgs != "" {
		fmt.Printf("\nNOT the default configuration: services ran with these added flags: %s\n", *serviceArgs)
	}
}

// parseServiceArgs parses -service-args.
func parseServiceArgs(s string) (map[string][]string, error) {
	out := map[string][]string{}
	for _, f := range strings.Fields(s) {
		name, arg, ok := strings.Cut(f, ":")
		if !ok || !slices.Contains(harness.ServiceNames, name) || !strings.HasPrefix(arg, "-") {
			return nil, fmt.Errorf("-service-args: %q is not <service>:<flag> with service one of %v", f, harness.ServiceNames)
		}
		out[name] = append(out[name], arg)
	}
	return out, nil
}

// row is the table row of a scenario's outcome.
func row(name string, ref Reference, m *Measurement, err error) Row {
	r := Row{Scenario: name, Flux: ref, Measured: m}
	if m == nil {
		r.Status = "failed"
		if err != nil {
			r.Status = "failed: " + err.Error()
		}
	}
	return r
}

// report makes the go test output carry the headline numbers too; ns/op is
// the scenario's wall time, not the whole sub-benchmark's.
func report(b *testing.B, m *Measurement) {
	b.ReportMetric(float64(m.Wall.Nanoseconds()), "ns/op")
	b.ReportMetric(m.ServiceCPU().Seconds(), "cpu-s")
	b.ReportMetric(float64(m.ServicePeakRSS())/mib, "peak-rss-MiB")
}

// options finds what the Env runs as the end-to-end tests do:
// KUBEBUILDER_ASSETS and HEADWATER_BIN_DIR as exported by make, or the
// repository's bin/k8s and bin/ after `make kube-tools build`.
func options() (Options, error) {
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		return Options{}, err
	}
	cfg := harness.Config{
		BinDir:    os.Getenv("HEADWATER_BIN_DIR"),
		AssetsDir: os.Getenv("KUBEBUILDER_ASSETS"),
		CRDDir:    filepath.Join(root, "deploy", "crds"),
		Dir:       os.TempDir(),
	}
	if cfg.BinDir == "" {
		cfg.BinDir = filepath.Join(root, "bin")
	}
	if cfg.AssetsDir == "" {
		cfg.AssetsDir = filepath.Join(root, "bin", "k8s")
	}
	if err := cfg.Check(); err != nil {
		return Options{}, fmt.Errorf("%w (run `make bench`, which builds them)", err)
	}
	start := time.Now()
	return Options{Harness: cfg, Progress: func(msg string) {
		fmt.Fprintf(os.Stderr, "bench %6.1fs %s\n", time.Since(start).Seconds(), msg)
	}}, nil
}
