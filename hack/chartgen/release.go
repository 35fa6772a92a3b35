package main

import (
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"

	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
)

// ReleaseFiles are the files `make release` writes beside the images,
// for version v: the default install, the Flux drop-in, the chart's
// package, and the checksums of every file of the release.
func ReleaseFiles(version string) (install, fluxSystem, chart, checksums string) {
	return "install.yaml", "install-flux-system.yaml", "headwater-" + strings.TrimPrefix(version, "v") + ".tgz", "checksums.txt"
}

// releaseVersion is what a release's version looks like: v and a
// semantic version.
var releaseVersion = regexp.MustCompile(`^v(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)(-[0-9A-Za-z.-]+)?(\+[0-9A-Za-z.-]+)?$`)

// Release writes the release of version into dir (made if missing):
// install.yaml (`kustomize build deploy`) and install-flux-system.yaml
// (`kustomize build deploy/overlays/flux-system`) with Headwater's image
// at the version's tag, the committed chart packaged with that version
// and image tag, and checksums.txt, the sha256 of every file in dir (the
// images `make release` wrote there too) as sha256sum prints them. If
// digests (a file of ref@digest lines, imagebuild -digests) names the
// version's image, the image is pinned to tag and digest.
func Release(root, version, dir, digests string) error {
	if !releaseVersion.MatchString(version) {
		return fmt.Errorf("version %q is not v<major>.<minor>.<patch>", version)
	}
	repo, _, err := headwaterImages(root)
	if err != nil {
		return err
	}
	image := repo + "/headwater"
	tag := version
	if digests != "" {
		d, err := imageDigest(digests, image+":"+version)
		if err != nil {
			return err
		}
		tag += "@" + d
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	r, err := NewRenderer(root)
	if err != nil {
		return err
	}
	install, fluxSystem, chartFile, checksums := ReleaseFiles(version)
	for file, base := range map[string]string{install: "deploy", fluxSystem: "deploy/overlays/flux-system"} {
		k := fmt.Sprintf("apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n  - ../%s\nimages:\n  - name: %s\n    newTag: %q\n", base, image, tag)
		if err := r.WriteFile("/release/kustomization.yaml", []byte(k)); err != nil {
			return err
		}
		y, err := r.BuildYAML("/release")
		if err != nil {
			return fmt.Errorf("%s: %w", base, err)
		}
		if err := os.WriteFile(filepath.Join(dir, file), y, 0o644); err != nil {
			return err
		}
	}
	if err := packageChart(filepath.Join(root, "charts", "headwater"), version, tag, filepath.Join(dir, chartFile)); err != nil {
		return err
	}
	return writeChecksums(dir, checksums)
}

// imageDigest returns the digest of ref in the file digests (ref@digest
// lines).
func imageDigest(digests, ref string) (string, error) {
	f, err := os.Open(digests)
	if err != nil {
		return "", err
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		r, d, ok := strings.Cut(strings.TrimSpace(s.Text()), "@")
		if ok && r == ref {
			return d, nil
		}
	}
	if err := s.Err(); err != nil {
		return "", err
	}
	return "", fmt.Errorf("%s names no digest of %s", digests, ref)
}

// packageChart writes the chart in dir, as `helm package --version
// --app-version` would, with its image tag set to tag, into the file out.
func packageChart(dir, version, tag, out string) error {
	c, err := loader.Load(dir)
	if err != nil {
		return fmt.Errorf("load %s: %w", dir, err)
	}
	old := c.Metadata.AppVersion
	c.Metadata.Version = strings.TrimPrefix(version, "v")
	c.Metadata.AppVersion = version
	// values.yaml is written from its text (its comments kept): the tag
	// is replaced there, and in the README's table.
	replaced := false
	for _, f := range c.Raw {
		if f.Name != chartutil.ValuesfileName {
			continue
		}
		line := "\n  tag: " + old + "\n"
		if !strings.Contains(string(f.Data), line) {
			return fmt.Errorf("%s/values.yaml sets no image tag %s", dir, old)
		}
		f.Data = []byte(strings.Replace(string(f.Data), line, "\n  tag: "+tag+"\n", 1))
		if c.Values, err = chartutil.ReadValues(f.Data); err != nil {
			return err
		}
		replaced = true
	}
	if !replaced {
		return fmt.Errorf("%s has no values.yaml", dir)
	}
	for _, f := range c.Files {
		if f.Name == "README.md" {
			f.Data = []byte(strings.ReplaceAll(string(f.Data), `"tag":"`+old+`"`, `"tag":"`+tag+`"`))
		}
	}
	tmp, err := os.MkdirTemp(filepath.Dir(out), ".chart-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	p, err := chartutil.Save(c, tmp)
	if err != nil {
		return fmt.Errorf("package the chart: %w", err)
	}
	return os.Rename(p, out)
}

// writeChecksums writes into dir/name the sha256 of every other file
// under dir, as `sha256sum` prints them (so `sha256sum -c` checks them).
func writeChecksums(dir, name string) error {
	var files []string
	err := filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil {
			return err
		}
		if rel != name {
			files = append(files, filepath.ToSlash(rel))
		}
		return nil
	})
	if err != nil {
		return err
	}
	slices.Sort(files)
	var b strings.Builder
	for _, f := range files {
		sum, err := fileSHA256(filepath.Join(dir, f))
		if err != nil {
			return err
		}
		fmt.Fprintf(&b, "%s  %s\n", sum, f)
	}
	return os.WriteFile(filepath.Join(dir, name), []byte(b.String()), 0o644)
}

// fileSHA256 is the hex sha256 of the file p.
func fileSHA256(p string) (string, error) {
	f, err := os.Open(p)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}
