package cluster

import (
	"archive/tar"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// ProbeImage is the image of the probe command (package probe), which the
// tests run in pods to download what a workload would.
const ProbeImage = "headwater.test/probe:e2e"

// ImportProbe builds the probe command and imports it into the node as
// ProbeImage.
func (c *Cluster) ImportProbe(ctx context.Context) error {
	dir, err := os.MkdirTemp("", "headwater-probe")
	if err != nil {
		return fmt.Errorf("probe image: %w", err)
	}
	defer os.RemoveAll(dir)
	bin := filepath.Join(dir, "probe")
	build := exec.CommandContext(ctx, "go", "build", "-trimpath", "-o", bin, "github.com/headwater-gitops/headwater/e2e/cluster/probe")
	build.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH=amd64")
	if out, err := build.CombinedOutput(); err != nil {
		return fmt.Errorf("build probe: %w: %s", err, out)
	}
	archive := filepath.Join(dir, "probe.tar")
	if err := singleBinaryImage(bin, "/probe", ProbeImage, archive); err != nil {
		return err
	}
	return c.ImportImage(ctx, archive)
}

// singleBinaryImage writes a docker tarball of ref: one layer holding the
// binary at path, run as 65532.
func singleBinaryImage(bin, path, ref, archive string) error {
	data, err := os.ReadFile(bin)
	if err != nil {
		return fmt.Errorf("image %s: %w", ref, err)
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	if err := tw.WriteHeader(&tar.Header{Name: path[1:], Mode: 0o755, Size: int64(len(data)), ModTime: time.Unix(0, 0), Typeflag: tar.TypeReg}); err != nil {
		return fmt.Errorf("image %s: %w", ref, err)
	}
	if _, err := tw.Write(data); err != nil {
		return fmt.Errorf("image %s: %w", ref, err)
	}
	if err := tw.Close(); err != nil {
		return fmt.Errorf("image %s: %w", ref, err)
	}
	layer, err := tarball.LayerFromReader(&buf)
	if err != nil {
		return fmt.Errorf("image %s: %w", ref, err)
	}
	img, err := mutate.AppendLayers(empty.Image, layer)
	if err != nil {
		return fmt.Errorf("image %s: %w", ref, err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return fmt.Errorf("image %s: %w", ref, err)
	}
	cf = cf.DeepCopy()
	cf.Architecture, cf.OS = "amd64", "linux"
	cf.Config = v1.Config{Entrypoint: []string{path}, User: "65532:65532"}
	if img, err = mutate.ConfigFile(img, cf); err != nil {
		return fmt.Errorf("image %s: %w", ref, err)
	}
	tag, err := name.NewTag(ref)
	if err != nil {
		return fmt.Errorf("image %s: %w", ref, err)
	}
	if err := tarball.WriteToFile(archive, tag, img); err != nil {
		return fmt.Errorf("image %s: %w", ref, err)
	}
	return nil
}
