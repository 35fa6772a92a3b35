package helmindex

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"helm.sh/helm/v3/pkg/repo"

	"github.com/headwater-gitops/headwater/testsupport/chartrepo"
)

// helmIndex packages charts with the Helm library and returns the index
// `helm repo index` writes for them, and the same index as JSON (as Flux
// stores it).
func helmIndex(t *testing.T, charts ...chartrepo.Chart) (yamlIndex, jsonIndex []byte) {
	t.Helper()
	dir := t.TempDir()
	for _, c := range charts {
		if _, err := chartrepo.Package(dir, c); err != nil {
			t.Fatal(err)
		}
	}
	idx, err := repo.IndexDirectory(dir, "https://charts.example.com")
	if err != nil {
		t.Fatal(err)
	}
	idx.SortEntries()
	p := filepath.Join(t.TempDir(), "index.yaml")
	if err := idx.WriteFile(p, 0o644); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	loaded, err := repo.LoadIndexFile(p)
	if err != nil {
		t.Fatal(err)
	}
	j, err := json.Marshal(loaded)
	if err != nil {
		t.Fatal(err)
	}
	return b, j
}

func TestCheck(t *testing.T) {
	good, asJSON := helmIndex(t,
		chartrepo.Chart{Name: "podinfo", Version: "6.1.0"},
		chartrepo.Chart{Name: "podinfo", Version: "6.2.0"},
		chartrepo.Chart{Name: "redis", Version: "1.0.0"})
	bomb := "apiVersion: v1\nentries:\n  a: &a [\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\"]\n" +
		"  b: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a]\n  c: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b]\n"
	for _, tc := range []struct {
		name  string
		index string
		want  error // nil: valid
	}{
		{"helm repo index", string(good), nil},
		{"json, as Flux stores it", string(asJSON), nil},
		{"empty entries", "apiVersion: v1\nentries: {}\n", nil},
		{"comments and document marker", "# a repository\n---\napiVersion: v1\n# charts\nentries:\n  a:\n  - name: a\n    version: 1.0.0\n", nil},
		{"block scalar with a star", "apiVersion: v1\nentries:\n  a:\n  - description: |\n      *bold* text\n      & more\n    name: a\n", nil},
		{"quoted star", "apiVersion: v1\nentries:\n  a:\n  - description: \"*x\"\n    name: a\n", nil},
		{"star inside a plain scalar", "apiVersion: v1\nentries:\n  a:\n  - description: a *b* c\n", nil},
		{"empty", "", ErrNotIndex},
		{"not yaml", "<html><body>Not Found</body></html>\n", ErrNotIndex},
		{"a list", "- apiVersion: v1\n- entries: {}\n", ErrNotIndex},
		{"no apiVersion", "entries:\n  a: []\n", ErrNotIndex},
		{"no entries", "apiVersion: v1\n", ErrNotIndex},
		{"json without entries", `{"apiVersion":"v1"}`, ErrNotIndex},
		{"broken json", `{"apiVersion":"v1","entries":{`, ErrNotIndex},
		{"alias bomb", bomb, ErrAlias},
		{"alias in a block mapping", "apiVersion: v1\nx: &x 1\nentries:\n  a: *x\n", ErrAlias},
		{"alias in a sequence", "apiVersion: v1\nentries:\n  a:\n  - *x\n", ErrAlias},
		{"second document", "apiVersion: v1\nentries: {}\n---\napiVersion: v1\n", ErrNotIndex},
		{"line too long", "apiVersion: v1\nentries: {}\ndescription: " + strings.Repeat("x", MaxLineSize) + "\n", ErrNotIndex},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := Check(strings.NewReader(tc.index))
			switch {
			case tc.want == nil && err != nil:
				t.Fatalf("Check: %v", err)
			case tc.want != nil && !errors.Is(err, tc.want):
				t.Fatalf("Check = %v, want %v", err, tc.want)
			}
		})
	}
}

func TestVersions(t *testing.T) {
	good, asJSON := helmIndex(t,
		chartrepo.Chart{Name: "podinfo", Version: "6.1.0"},
		chartrepo.Chart{Name: "podinfo", Version: "6.2.0"},
		chartrepo.Chart{Name: "podinfo-extra", Version: "0.1.0"},
		chartrepo.Chart{Name: "redis", Version: "1.0.0"})
	for _, form := range []struct {
		name  string
		index []byte
	}{{"yaml", good}, {"json", asJSON}} {
		for _, tc := range []struct {
			chart string
			want  []string
		}{
			{"podinfo", []string{"6.2.0", "6.1.0"}},
			{"podinfo-extra", []string{"0.1.0"}},
			{"redis", []string{"1.0.0"}},
			{"missing", nil},
		} {
			t.Run(form.name+"/"+tc.chart, func(t *testing.T) {
				got, err := Versions(strings.NewReader(string(form.index)), tc.chart)
				if err != nil {
					t.Fatal(err)
				}
				var versions []string
				for _, v := range got {
					versions = append(versions, v.Version)
					if v.Name != tc.chart || len(v.URLs) != 1 || v.Digest == "" {
						t.Errorf("entry %+v lacks name, URL or digest", v)
					}
				}
				if fmt.Sprint(versions) != fmt.Sprint(tc.want) {
					t.Fatalf("versions = %v, want %v", versions, tc.want)
				}
			})
		}
	}
	t.Run("flow style entries", func(t *testing.T) {
		got, err := Versions(strings.NewReader("apiVersion: v1\nentries: {a: [{name: a, version: 1.0.0}]}\n"), "a")
		if err != nil || len(got) != 1 || got[0].Version != "1.0.0" {
			t.Fatalf("Versions = %v, %v", got, err)
		}
	})
	t.Run("quoted names and indented sequences", func(t *testing.T) {
		idx := "apiVersion: v1\nentries:\n    \"b\":\n        - name: b\n          version: 2.0.0\n    'a':\n        - name: a\n          version: 1.0.0\n          description: |\n            a: b\n    c: []\ngenerated: now\n"
		got, err := Versions(strings.NewReader(idx), "a")
		if err != nil || len(got) != 1 || got[0].Version != "1.0.0" || got[0].Description != "a: b\n" {
			t.Fatalf("Versions = %+v, %v", got, err)
		}
	})
}
