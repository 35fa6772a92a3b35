// Command chartgen writes the Helm chart charts/headwater from the
// kustomize tree under deploy/, so that the two install the same objects
// and there is one truth to maintain (docs/design.md, "One truth for
// kustomize and Helm").
//
// It renders, with kustomize's krusty, every combination of the chart's
// choices (storage, NATS cluster, NATS TLS, receivers, dispatcher,
// monitoring, the Flux drop-in) as a kustomization over deploy/, turns
// the parameters a chart user sets without choosing another kustomization
// (namespace, images, replicas, resources, the S3 Secret, the volume
// size) into template expressions, and merges the variants of each object
// into one template whose lines are guarded by the choices they belong to.
// values.yaml takes its defaults from the same renderings.
//
//	cd hack/chartgen && GOWORK=off go run . -root ../.. -out ../../charts/headwater
//
// `make generate` runs it and `make verify` checks its output is
// committed. With -release vX.Y.Z it writes a release's manifests, the
// chart's package and their checksums instead (`make release`).
package main

import (
	"flag"
	"fmt"
	"os"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "chartgen:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	fs := flag.NewFlagSet("chartgen", flag.ContinueOnError)
	root := fs.String("root", "../..", "the repository's root, holding deploy/")
	out := fs.String("out", "../../charts/headwater", "the chart's directory, written afresh")
	release := fs.String("release", "", "Write the release of this version (vX.Y.Z) into -release-dir instead of the chart.")
	releaseDir := fs.String("release-dir", "../../bin/release", "The release's directory.")
	digests := fs.String("digests", "", "With -release: a file of the images' ref@digest lines (imagebuild -digests), to pin Headwater's image to its digest.")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *release != "" {
		return Release(*root, *release, *releaseDir, *digests)
	}
	chart, err := Generate(*root)
	if err != nil {
		return err
	}
	return chart.Write(*out)
}
