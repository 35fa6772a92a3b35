package ociimage

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/remote"
)

// created is the SOURCE_DATE_EPOCH of the tests.
var created = time.Unix(1700000000, 0).UTC()

// pause is the binary template ({os}_{arch}) of the pause program, built
// once by TestMain for linux/amd64 and linux/arm64.
var pause string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "ociimage-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	code := 1
	if err := buildPause(dir); err != nil {
		fmt.Fprintln(os.Stderr, err)
	} else {
		pause = filepath.Join(dir, "{os}_{arch}", "pause")
		code = m.Run()
	}
	os.RemoveAll(dir)
	os.Exit(code)
}

// buildPause builds the pause program into dir/linux_<arch>/pause.
func buildPause(dir string) error {
	for _, arch := range []string{"amd64", "arm64"} {
		out := filepath.Join(dir, "linux_"+arch, "pause")
		cmd := exec.Command("go", "build", "-trimpath", "-ldflags", "-s -w", "-o", out, "./pause")
		cmd.Dir = filepath.Join("..", "..")
		cmd.Env = append(os.Environ(), "GOWORK=off", "CGO_ENABLED=0", "GOOS=linux", "GOARCH="+arch)
		if b, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("build pause for %s: %w\n%s", arch, err, b)
		}
	}
	return nil
}

func platforms(t *testing.T, ss ...string) []Platform {
	t.Helper()
	var ps []Platform
	for _, s := range ss {
		p, err := ParsePlatform(s)
		if err != nil {
			t.Fatal(err)
		}
		ps = append(ps, p)
	}
	return ps
}

func build(t *testing.T, s Spec, at time.Time, ps []Platform) *Built {
	t.Helper()
	b, err := NewBuilder(at)
	if err != nil {
		t.Fatal(err)
	}
	built, err := b.Build(s, ps)
	if err != nil {
		t.Fatal(err)
	}
	return built
}

func digest(t *testing.T, b *Built) v1.Hash {
	t.Helper()
	d, err := b.Index.Digest()
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// TestReproducible: the same binaries and time give the same index digest;
// another time gives another.
func TestReproducible(t *testing.T) {
	bin := pause
	ps := platforms(t, "linux/amd64", "linux/arm64")
	spec := HeadwaterSpec("example.com/hw/pause:v1", "pause", bin, "v1.2.3", "abc123", created)
	first, second := build(t, spec, created, ps), build(t, spec, created, ps)
	if a, b := digest(t, first), digest(t, second); a != b {
		t.Fatalf("same inputs, different digests: %s and %s", a, b)
	}
	later := created.Add(time.Hour)
	other := build(t, HeadwaterSpec(spec.Ref, "pause", bin, "v1.2.3", "abc123", later), later, ps)
	if digest(t, first) == digest(t, other) {
		t.Fatal("another SOURCE_DATE_EPOCH, same digest")
	}
}

// TestConfig: platform, user, entrypoint, environment, created time and
// labels, and the files the layers hold.
func TestConfig(t *testing.T) {
	bin := pause
	spec := HeadwaterSpec("example.com/hw/fetcher:v1", "fetcher", bin, "v1.2.3", "abc123", created)
	built := build(t, spec, created, platforms(t, "linux/amd64", "linux/arm64"))

	im, err := built.Index.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, m := range im.Manifests {
		got = append(got, m.Platform.String())
	}
	if want := []string{"linux/amd64", "linux/arm64/v8"}; !slices.Equal(got, want) {
		t.Fatalf("index platforms %v, want %v", got, want)
	}

	for _, pi := range built.Images {
		cfg, err := pi.Image.ConfigFile()
		if err != nil {
			t.Fatal(err)
		}
		if cfg.OS != "linux" || cfg.Architecture != pi.Platform.Arch || cfg.Variant != pi.Platform.Variant {
			t.Errorf("%s: config platform %s/%s/%s", pi.Platform, cfg.OS, cfg.Architecture, cfg.Variant)
		}
		if cfg.Config.User != "65532:65532" {
			t.Errorf("%s: user %q", pi.Platform, cfg.Config.User)
		}
		if !slices.Equal(cfg.Config.Entrypoint, []string{"/headwater"}) {
			t.Errorf("%s: entrypoint %q", pi.Platform, cfg.Config.Entrypoint)
		}
		if !slices.Contains(cfg.Config.Env, "SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt") {
			t.Errorf("%s: env %q", pi.Platform, cfg.Config.Env)
		}
		if !cfg.Created.Time.Equal(created) {
			t.Errorf("%s: created %s, want %s", pi.Platform, cfg.Created.Time, created)
		}
		for k, want := range map[string]string{
			"org.opencontainers.image.title":    "headwater-fetcher",
			"org.opencontainers.image.source":   Source,
			"org.opencontainers.image.version":  "v1.2.3",
			"org.opencontainers.image.revision": "abc123",
			"org.opencontainers.image.created":  "2023-11-14T22:13:20Z",
		} {
			if got := cfg.Config.Labels[k]; got != want {
				t.Errorf("%s: label %s = %q, want %q", pi.Platform, k, got, want)
			}
		}
		if pi.Compressed <= 0 || pi.Unpacked <= pi.Compressed {
			t.Errorf("%s: sizes compressed %d, unpacked %d", pi.Platform, pi.Compressed, pi.Unpacked)
		}

		files := imageFiles(t, pi.Image)
		for name, want := range map[string]struct {
			mode     int64
			uid, gid int
		}{
			"headwater":                         {0o755, 0, 0},
			"etc/ssl/certs/ca-certificates.crt": {0o644, 0, 0},
			"etc/passwd":                        {0o644, 0, 0},
			"data/":                             {0o755, 65532, 65532},
			"tmp/":                              {0o1777, 65532, 65532},
		} {
			h, ok := files[name]
			if !ok {
				t.Errorf("%s: no %s in the image", pi.Platform, name)
				continue
			}
			if h.Mode != want.mode || h.Uid != want.uid || h.Gid != want.gid || !h.ModTime.Equal(created) {
				t.Errorf("%s: %s mode %o uid %d gid %d mtime %s", pi.Platform, name, h.Mode, h.Uid, h.Gid, h.ModTime)
			}
		}
	}
}

// imageFiles reads the headers of every layer's entries.
func imageFiles(t *testing.T, img v1.Image) map[string]*tar.Header {
	t.Helper()
	layers, err := img.Layers()
	if err != nil {
		t.Fatal(err)
	}
	files := map[string]*tar.Header{}
	for _, l := range layers {
		rc, err := l.Uncompressed()
		if err != nil {
			t.Fatal(err)
		}
		tr := tar.NewReader(rc)
		for {
			h, err := tr.Next()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			files[h.Name] = h
		}
		rc.Close()
	}
	return files
}

// TestCARoots: the bundle parses, and holds enough roots to be the NSS set.
func TestCARoots(t *testing.T) {
	pemBytes, err := CARoots()
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for rest := pemBytes; ; {
		var b *pem.Block
		b, rest = pem.Decode(rest)
		if b == nil {
			break
		}
		if _, err := x509.ParseCertificate(b.Bytes); err != nil {
			t.Fatalf("root %d: %v", n, err)
		}
		n++
	}
	if n < 100 {
		t.Fatalf("%d roots, want the NSS set (over 100)", n)
	}
}

// TestArchiveRoundTrip: the archive is an OCI layout whose index.json names
// every image by its full reference, and whose indexes read back intact.
func TestArchiveRoundTrip(t *testing.T) {
	bin := pause
	ps := platforms(t, "linux/"+runtime.GOARCH)
	pause, err := ThirdPartySpec("pause", "registry.k8s.io/pause:3.10", bin, created)
	if err != nil {
		t.Fatal(err)
	}
	hw := HeadwaterSpec("ghcr.io/headwater-gitops/watcher:v0.1.0", "watcher", bin, "v1", "r1", created)
	images := []*Built{build(t, pause, created, ps), build(t, hw, created, ps)}

	dir := t.TempDir()
	archive := filepath.Join(dir, "images.tar")
	if err := WriteArchive(archive, images, created); err != nil {
		t.Fatal(err)
	}
	again := filepath.Join(dir, "again.tar")
	if err := WriteArchive(again, images, created); err != nil {
		t.Fatal(err)
	}
	a, _ := os.ReadFile(archive)
	b, _ := os.ReadFile(again)
	if !bytes.Equal(a, b) {
		t.Error("the same images gave two different archives")
	}

	root := filepath.Join(dir, "oci")
	untar(t, archive, root)
	idx, err := layout.ImageIndexFromPath(root)
	if err != nil {
		t.Fatal(err)
	}
	im, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]v1.Hash{}
	for _, b := range images {
		want[b.Spec.Ref] = digest(t, b)
	}
	if len(im.Manifests) != len(want) {
		t.Fatalf("%d index.json entries, want %d", len(im.Manifests), len(want))
	}
	for _, d := range im.Manifests {
		ref := d.Annotations[RefName]
		if d.Annotations[ContainerdImageName] != ref || want[ref] != d.Digest {
			t.Errorf("entry %v: want %s named twice, digest %s", d.Annotations, ref, want[ref])
		}
		child, err := idx.ImageIndex(d.Digest)
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
		if _, ok := imageFiles(t, img)["etc/passwd"]; !ok {
			t.Errorf("%s: layers do not read back", ref)
		}
	}
}

func untar(t *testing.T, file, dir string) {
	t.Helper()
	f, err := os.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return
		}
		if err != nil {
			t.Fatal(err)
		}
		p := filepath.Join(dir, filepath.FromSlash(h.Name))
		if h.Typeflag == tar.TypeDir {
			if err := os.MkdirAll(p, 0o755); err != nil {
				t.Fatal(err)
			}
			continue
		}
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		data, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// TestCheckStatic: a binary for another architecture is refused.
func TestCheckStatic(t *testing.T) {
	arm := Spec{Binary: pause}.BinaryFor(Platform{OS: "linux", Arch: "arm64"})
	if err := CheckStatic(arm, Platform{OS: "linux", Arch: "arm64"}); err != nil {
		t.Fatalf("arm64 binary as arm64: %v", err)
	}
	if err := CheckStatic(arm, Platform{OS: "linux", Arch: "amd64"}); err == nil {
		t.Fatal("arm64 binary accepted as amd64")
	}
}

// TestPushRef: a reference keeps its last path element and tag under the
// push prefix.
func TestPushRef(t *testing.T) {
	for ref, want := range map[string]string{
		"ghcr.io/headwater-gitops/fetcher:v0.1.0": "localhost:5000/hw/fetcher:v0.1.0",
		"registry.k8s.io/coredns/coredns:v1.12.4": "localhost:5000/hw/coredns:v1.12.4",
		"docker.io/library/nats:2.15.2":           "localhost:5000/hw/nats:2.15.2",
	} {
		got, err := PushRef("localhost:5000/hw/", ref)
		if err != nil || got != want {
			t.Errorf("PushRef(%s) = %q, %v; want %q", ref, got, err, want)
		}
	}
}

// TestPush: an image pushed over plain HTTP to a registry reads back with
// the digest it was built with.
// distribution starts the CNCF distribution registry the Makefile builds
// (HEADWATER_REGISTRY_BIN) on a free port and returns its host:port.
func distribution(t *testing.T) string {
	t.Helper()
	bin := os.Getenv("HEADWATER_REGISTRY_BIN")
	if bin == "" {
		t.Fatal("HEADWATER_REGISTRY_BIN is not set: run `make registry` (it builds the distribution registry; `make test` runs it first)")
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	host := ln.Addr().String()
	ln.Close()
	dir := t.TempDir()
	cfg := filepath.Join(dir, "config.yml")
	conf := fmt.Sprintf("version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n    rootdirectory: %q\nhttp:\n  addr: %q\n", filepath.Join(dir, "data"), host)
	if err := os.WriteFile(cfg, []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "serve", cfg)
	cmd.Env = append(os.Environ(), "OTEL_TRACES_EXPORTER=none", "OTEL_SDK_DISABLED=true")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	for deadline := time.Now().Add(30 * time.Second); ; {
		resp, err := http.Get("http://" + host + "/v2/")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return host
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("registry not serving on %s: %v\n%s", host, err, out.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestPush pushes a two-platform image to a real registry (the CNCF
// distribution registry) and reads the same index back.
func TestPush(t *testing.T) {
	host := distribution(t)
	spec, err := ThirdPartySpec("pause", "registry.k8s.io/pause:3.10", pause, created)
	if err != nil {
		t.Fatal(err)
	}
	built := build(t, spec, created, platforms(t, "linux/amd64", "linux/arm64"))
	var out bytes.Buffer
	if err := Push(context.Background(), host+"/hw", []*Built{built}, true, &out); err != nil {
		t.Fatal(err)
	}
	ref, err := name.ParseReference(host+"/hw/pause:3.10", name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	idx, err := remote.Index(ref)
	if err != nil {
		t.Fatal(err)
	}
	got, err := idx.Digest()
	if err != nil {
		t.Fatal(err)
	}
	if want := digest(t, built); got != want {
		t.Fatalf("pushed %s, read back %s", want, got)
	}
}
