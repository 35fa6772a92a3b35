package main

import (
	"archive/tar"
	"context"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"testing"

	"github.com/google/go-containerregistry/pkg/v1/layout"
)

// TestVersionMatchesLabels builds headwater the way the Makefile does
// (-ldflags -X into pkg/buildinfo), runs imagebuild on it, then runs the
// /headwater the image holds with -version, alone and as a role: it must
// report the version, revision and build date the image's labels carry.
func TestVersionMatchesLabels(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a service from the workspace")
	}
	const (
		service  = "headwater"
		version  = "v9.8.7-test"
		revision = "0123456789abcdef0123456789abcdef01234567"
		epoch    = "1700000000"
		date     = "2023-11-14T22:13:20Z"
	)
	dir := t.TempDir()
	bi := "github.com/headwater-gitops/headwater/pkg/buildinfo"
	bin := filepath.Join(dir, "linux_"+runtime.GOARCH, service)
	build := exec.Command("go", "build", "-trimpath", "-o", bin, "-ldflags",
		"-s -w -X "+bi+".Version="+version+" -X "+bi+".Revision="+revision+" -X "+bi+".BuildDate="+date, ".")
	build.Dir = filepath.Join("..", "..", "cmd", "headwater")
	// The services build in the workspace: go.work, not GOWORK=off.
	build.Env = append(os.Environ(), "GOWORK=", "CGO_ENABLED=0", "GOOS=linux")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build %s: %v\n%s", service, err, out)
	}

	oci := filepath.Join(dir, "oci")
	o := options{
		platforms: "linux/" + runtime.GOARCH, epoch: epoch, version: version, revision: revision,
		registry: "ghcr.io/headwater-gitops", tag: "v0.1.0", layout: oci,
		services: listFlag{service + "=" + filepath.Join(dir, "{os}_{arch}", service)},
	}
	if err := run(context.Background(), o); err != nil {
		t.Fatal(err)
	}

	idx, err := layout.ImageIndexFromPath(oci)
	if err != nil {
		t.Fatal(err)
	}
	top, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	if got := top.Manifests[0].Annotations["org.opencontainers.image.ref.name"]; got != "ghcr.io/headwater-gitops/"+service+":v0.1.0" {
		t.Fatalf("image named %q", got)
	}
	child, err := idx.ImageIndex(top.Manifests[0].Digest)
	if err != nil {
		t.Fatal(err)
	}
	cm, err := child.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	img, err := child.Image(cm.Manifests[0].Digest)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	labels := cfg.Config.Labels

	// The binary the image holds, at /headwater in the top layer.
	layers, err := img.Layers()
	if err != nil {
		t.Fatal(err)
	}
	rc, err := layers[len(layers)-1].Uncompressed()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	extracted := filepath.Join(dir, "headwater")
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			t.Fatal("no headwater in the image's top layer")
		}
		if err != nil {
			t.Fatal(err)
		}
		if h.Name != "headwater" {
			continue
		}
		data, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(extracted, data, 0o755); err != nil {
			t.Fatal(err)
		}
		break
	}
	if labels["org.opencontainers.image.title"] != "headwater" {
		t.Errorf("title %q, want headwater", labels["org.opencontainers.image.title"])
	}
	for _, args := range [][]string{{"-version"}, {"-target=artifact-server", "-version"}} {
		out, err := exec.Command(extracted, args...).Output()
		if err != nil {
			t.Fatalf("headwater %q: %v", args, err)
		}
		name := service
		if len(args) > 1 {
			name = "artifact-server"
		}
		m := regexp.MustCompile(`^` + name + ` version (\S+) \(revision ([0-9a-f]+), built (\S+),`).FindStringSubmatch(string(out))
		if m == nil {
			t.Fatalf("headwater %q printed %q", args, out)
		}
		for i, key := range []string{"version", "revision", "created"} {
			if l := labels["org.opencontainers.image."+key]; l != m[i+1] {
				t.Errorf("headwater %q: label %s %q, but the binary says %q", args, key, l, m[i+1])
			}
		}
	}
}
