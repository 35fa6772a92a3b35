package main

import (
	"bufio"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"helm.sh/helm/v3/pkg/action"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/lint/support"
	"helm.sh/helm/v3/pkg/releaseutil"
	"sigs.k8s.io/yaml"
)

// parseManifests decodes a multi-document YAML file into objects by key,
// through JSON as kustomizeBuild does; it fails on a document that is
// not an object with a kind and a name.
func parseManifests(t *testing.T, path string) map[string]object {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]object{}
	for _, doc := range releaseutil.SplitManifests(string(b)) {
		var o object
		if err := yaml.Unmarshal([]byte(doc), &o); err != nil {
			t.Fatalf("%s: %v\n%s", path, err, doc)
		}
		if o["kind"] == nil || dig(o, "metadata", "name") == nil {
			t.Fatalf("%s: a document is not an object:\n%s", path, doc)
		}
		if _, dup := out[o.key()]; dup {
			t.Errorf("%s has %s twice", path, o.key())
		}
		out[o.key()] = o
	}
	return out
}

// kustomizeWithImage is kustomizeBuild of dir (with its Namespace), with
// Headwater's image ref replaced by want.
func kustomizeWithImage(t *testing.T, dir, want string) map[string]object {
	t.Helper()
	repo, tag, err := headwaterImages(root)
	if err != nil {
		t.Fatal(err)
	}
	r, err := NewRenderer(root)
	if err != nil {
		t.Fatal(err)
	}
	objs, err := r.RenderDir("/" + dir)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]object{}
	for _, o := range objs {
		b, err := json.Marshal(o.Map)
		if err != nil {
			t.Fatal(err)
		}
		b = []byte(strings.ReplaceAll(string(b), `"`+repo+"/headwater:"+tag+`"`, `"`+want+`"`))
		var n object
		if err := json.Unmarshal(b, &n); err != nil {
			t.Fatal(err)
		}
		out[n.key()] = n
	}
	return out
}

// TestRelease builds a release (without images: a digests file stands
// for imagebuild's) into a temporary directory and checks that
// install.yaml and install-flux-system.yaml are kustomize's renderings
// with the version's image, pinned; that the chart's package loads, lints,
// carries the version and renders the same objects as install.yaml; and
// that checksums.txt holds every file's sha256.
func TestRelease(t *testing.T) {
	const version = "v9.8.7"
	digest := "sha256:" + strings.Repeat("ab", 32)
	dir := t.TempDir()
	repo, _, err := headwaterImages(root)
	if err != nil {
		t.Fatal(err)
	}
	ref := repo + "/headwater:" + version
	digests := filepath.Join(dir, "digests.txt")
	if err := os.WriteFile(digests, []byte(ref+"@"+digest+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := Release(root, version, dir, digests); err != nil {
		t.Fatal(err)
	}
	install, fluxSystem, chartFile, checksums := ReleaseFiles(version)
	pinned := ref + "@" + digest

	installObjs := parseManifests(t, filepath.Join(dir, install))
	compare(t, installObjs, kustomizeWithImage(t, "deploy", pinned))
	compare(t, parseManifests(t, filepath.Join(dir, fluxSystem)), kustomizeWithImage(t, "deploy/overlays/flux-system", pinned))
	if got := dig(installObjs["Deployment "+Namespace+"/fetcher"], "spec", "template", "spec", "containers", "0", "image"); got != pinned {
		t.Errorf("install.yaml's fetcher runs %v, want %s", got, pinned)
	}

	pkg := filepath.Join(dir, chartFile)
	c, err := loader.Load(pkg)
	if err != nil {
		t.Fatalf("load %s: %v", pkg, err)
	}
	if c.Metadata.Version != "9.8.7" || c.Metadata.AppVersion != version {
		t.Errorf("chart version %s, appVersion %s; want 9.8.7, %s", c.Metadata.Version, c.Metadata.AppVersion, version)
	}
	l := action.NewLint()
	l.Namespace = Namespace
	res := l.Run([]string{pkg}, map[string]any{})
	for _, err := range res.Errors {
		t.Errorf("helm lint %s: %v", chartFile, err)
	}
	for _, m := range res.Messages {
		if m.Severity > support.InfoSev {
			t.Errorf("helm lint %s: %s", chartFile, m)
		}
	}
	helm, err := helmTemplateRelease(t, pkg, "headwater", Namespace, map[string]any{})
	if err != nil {
		t.Fatalf("helm template %s: %v", chartFile, err)
	}
	delete(installObjs, "Namespace <nil>/"+Namespace)
	compare(t, helm, installObjs)

	// checksums.txt: every file but itself, each sum right.
	f, err := os.Open(filepath.Join(dir, checksums))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	listed := map[string]bool{}
	s := bufio.NewScanner(f)
	for s.Scan() {
		sum, name, ok := strings.Cut(s.Text(), "  ")
		if !ok {
			t.Fatalf("checksums.txt: line %q is not <sha256>  <file>", s.Text())
		}
		got, err := fileSHA256(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		if got != sum {
			t.Errorf("checksums.txt: %s is %s, the file's sha256 %s", name, sum, got)
		}
		listed[name] = true
	}
	for _, name := range []string{install, fluxSystem, chartFile, "digests.txt"} {
		if !listed[name] {
			t.Errorf("checksums.txt does not list %s", name)
		}
	}
}

// TestReleaseRejectsBadVersions checks that a version that is not
// v<semver>, or one the digests file has no image of, writes nothing.
func TestReleaseRejectsBadVersions(t *testing.T) {
	dir := t.TempDir()
	for _, v := range []string{"1.2.3", "v1.2", "latest"} {
		if err := Release(root, v, dir, ""); err == nil || !strings.Contains(err.Error(), "is not v<major>.<minor>.<patch>") {
			t.Errorf("version %s: %v", v, err)
		}
	}
	digests := filepath.Join(dir, "digests.txt")
	if err := os.WriteFile(digests, []byte("example.com/other:v1.2.3@sha256:00\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := Release(root, "v1.2.3", filepath.Join(dir, "out"), digests); err == nil || !strings.Contains(err.Error(), "names no digest") {
		t.Errorf("digests without the image: %v", err)
	}
}
