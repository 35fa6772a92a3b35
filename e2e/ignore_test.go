package e2e

import (
	"reflect"
	"testing"

	sourcev1 "github.com/fluxcd/source-controller/api/v1"
)

// ignoreTree is a repository with what Flux leaves out by default: VCS
// files, CI configuration, images, archives and tool files.
var ignoreTree = map[string]string{
	"README.md":                 "# ignore\n",
	".gitignore":                "*.tmp\n",
	".gitlab-ci.yml":            "stages: [test]\n",
	".github/workflows/ci.yaml": "on: push\n",
	".sops.yaml":                "creation_rules: []\n",
	"logo.png":                  "png",
	"photo.jpg":                 "jpg",
	"bundle.tar.gz":             "not really a tarball",
	"deploy/app.yaml":           "kind: App\n",
	"deploy/README.md":          "# deploy\n",
	"deploy/base/notes.txt":     "notes\n",
	"deploy/icon.png":           "png",
	"docs/guide.md":             "# guide\n",
}

// ignoreMarkdown is spec.ignore leaving out every Markdown file.
const ignoreMarkdown = "*.md\n"

// TestIgnore checks what goes into an artifact: Flux's default exclusions
// with no ignore rule at all; spec.ignore, which replaces the defaults
// (but not the VCS patterns); .sourceignore files in the repository, scoped
// to their directory, with spec.ignore applied after them; and a change of
// spec.ignore on the same commit, which rebuilds the artifact and sets
// status.observedIgnore.
func TestIgnore(t *testing.T) {
	requireEnv(t)
	t.Parallel()
	_, c := newRepo(t, "ignore", ignoreTree)
	_, cs := newRepo(t, "ignore-sourceignore", map[string]string{
		".sourceignore":             "# no docs, no images\ndocs/\n*.png\n",
		"deploy/.sourceignore":      "secret.yaml\n",
		"README.md":                 "# sourceignore\n",
		".gitignore":                "*.tmp\n",
		".github/workflows/ci.yaml": "on: push\n",
		"docs/guide.md":             "# guide\n",
		"deploy/app.yaml":           "kind: App\n",
		"deploy/secret.yaml":        "kind: Secret\n",
		"deploy/icon.png":           "png",
		"secret.yaml":               "kind: NotScoped\n",
		"logo.png":                  "png",
	})
	ptr := func(s string) *string { return &s }

	defaults := []string{"README.md", "deploy/README.md", "deploy/app.yaml", "deploy/base/notes.txt", "docs/guide.md"}
	markdownLess := []string{".github/workflows/ci.yaml", ".gitlab-ci.yml", ".sops.yaml", "bundle.tar.gz",
		"deploy/app.yaml", "deploy/base/notes.txt", "deploy/icon.png", "logo.png", "photo.jpg"}
	tests := []struct {
		name   string
		repo   string
		commit string
		ignore *string
		want   []string
	}{
		// .git, .gitignore, CI files, images, archives and .sops.yaml stay out.
		{name: "ignore-defaults", repo: "ignore", commit: c, want: defaults},
		// Flux's documented example: only deploy/, without its docs.
		{
			name: "ignore-only-deploy", repo: "ignore", commit: c,
			ignore: ptr("# exclude all\n/*\n# include deploy dir\n!/deploy\n# exclude file extensions from deploy dir\n/deploy/**/*.md\n/deploy/**/*.txt\n"),
			want:   []string{"deploy/app.yaml", "deploy/icon.png"},
		},
		// spec.ignore replaces the defaults: images and CI files come back.
		{name: "ignore-markdown", repo: "ignore", commit: c, ignore: ptr(ignoreMarkdown), want: markdownLess},
		// An empty spec.ignore has no pattern: the defaults apply.
		{name: "ignore-empty", repo: "ignore", commit: c, ignore: ptr(""), want: defaults},
		// .sourceignore files replace the defaults too; each is scoped to
		// its directory and stays in the artifact.
		{
			name: "ignore-sourceignore", repo: "ignore-sourceignore", commit: cs,
			want: []string{".github/workflows/ci.yaml", ".sourceignore", "README.md", "deploy/.sourceignore", "deploy/app.yaml", "secret.yaml"},
		},
		// spec.ignore comes after the .sourceignore files: it adds patterns
		// and can bring back what they leave out.
		{
			name: "ignore-sourceignore-spec", repo: "ignore-sourceignore", commit: cs, ignore: ptr("README.md\n!docs/guide.md\n"),
			want: []string{".github/workflows/ci.yaml", ".sourceignore", "deploy/.sourceignore", "deploy/app.yaml", "docs/guide.md", "secret.yaml"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			createSource(t, tt.name, env.Git.RepoURL(tt.repo), branch, func(o *sourcev1.GitRepository) { o.Spec.Ignore = tt.ignore })
			obj := waitArtifact(t, tt.name, revision(tt.commit))
			checkStored(t, obj, tt.commit)
			if got := fileNames(artifactFiles(t, obj)); !reflect.DeepEqual(got, tt.want) {
				t.Errorf("artifact holds\n %q\nwant\n %q", got, tt.want)
			}
			if !reflect.DeepEqual(obj.Status.ObservedIgnore, tt.ignore) {
				t.Errorf("status.observedIgnore = %s, want %s", strPtr(obj.Status.ObservedIgnore), strPtr(tt.ignore))
			}
		})
	}

	// The same commit with another spec.ignore: a new artifact, and
	// status.observedIgnore says which rules it was built with.
	t.Run("change", func(t *testing.T) {
		t.Parallel()
		const name = "ignore-change"
		createSource(t, name, env.Git.RepoURL("ignore"), branch)
		obj := waitArtifact(t, name, revision(c))
		if got := fileNames(artifactFiles(t, obj)); !reflect.DeepEqual(got, defaults) {
			t.Fatalf("artifact with the defaults holds %q, want %q", got, defaults)
		}

		patch(t, name, func(o *sourcev1.GitRepository) { o.Spec.Ignore = ptr(ignoreMarkdown) })
		obj = waitRebuilt(t, name, revision(c), obj.Status.Artifact.Digest)
		checkStored(t, obj, c)
		if got := fileNames(artifactFiles(t, obj)); !reflect.DeepEqual(got, markdownLess) {
			t.Errorf("artifact after setting spec.ignore holds\n %q\nwant\n %q", got, markdownLess)
		}
		if got := obj.Status.ObservedIgnore; got == nil || *got != ignoreMarkdown {
			t.Errorf("status.observedIgnore = %s, want %q", strPtr(got), ignoreMarkdown)
		}

		// Back to no rule at all: the defaults again.
		patch(t, name, func(o *sourcev1.GitRepository) { o.Spec.Ignore = nil })
		obj = waitRebuilt(t, name, revision(c), obj.Status.Artifact.Digest)
		checkStored(t, obj, c)
		if got := fileNames(artifactFiles(t, obj)); !reflect.DeepEqual(got, defaults) {
			t.Errorf("artifact after removing spec.ignore holds %q, want %q", got, defaults)
		}
		if got := obj.Status.ObservedIgnore; got != nil {
			t.Errorf("status.observedIgnore = %q after removing spec.ignore, want none", *got)
		}
	})
	t.Cleanup(func() { requireServicesRunning(t) })
}

// strPtr shows an optional string for a test message.
func strPtr(s *string) string {
	if s == nil {
		return "<nil>"
	}
	return "\"" + *s + "\""
}
