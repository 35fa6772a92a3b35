package compose

import (
	"errors"
	"reflect"
	"strings"
	"testing"

	swv1beta1 "github.com/fluxcd/source-watcher/api/v2/v1beta1"
)

func TestParsePatternRefuses(t *testing.T) {
	for pattern, want := range map[string]string{
		"repo/apps/{app}":             "invalid pathPattern format",
		"@repo/apps/{}":               "empty capture variable",
		"@repo/apps/{app-name}":       "must match [A-Za-z_][A-Za-z0-9_]*",
		"@repo/apps/{app":             "missing closing brace",
		"@repo/apps/app}":             "missing opening brace",
		"@repo/apps/{app}/envs/{app}": "duplicate capture variable",
		"@repo/../{app}":              "escapes its root",
		"@repo/":                      "names no directory",
	} {
		_, err := ParsePattern(pattern)
		if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), want) {
			t.Errorf("ParsePattern(%q) = %v, want ErrInvalid saying %q", pattern, err, want)
		}
	}
}

func TestValidatePattern(t *testing.T) {
	ok := func() *swv1beta1.ArtifactGeneratorSpec {
		return &swv1beta1.ArtifactGeneratorSpec{
			Sources:     []swv1beta1.SourceReference{{Alias: "repo", Kind: "GitRepository", Name: "r"}},
			PathPattern: "@repo/apps/{app}/envs/{env}",
			OutputArtifacts: []swv1beta1.OutputArtifact{{Name: "{app}-{env}", Revision: "@repo",
				Copy: []swv1beta1.CopyOperation{cp("@repo/apps/{app}/envs/{env}/**", "@artifact/{env}/")}}},
		}
	}
	if err := Validate(ok()); err != nil {
		t.Fatalf("valid spec: %v", err)
	}
	for name, mutate := range map[string]func(*swv1beta1.ArtifactGeneratorSpec){
		"unknown alias":             func(s *swv1beta1.ArtifactGeneratorSpec) { s.PathPattern = "@nope/apps/{app}" },
		"placeholder not a capture": func(s *swv1beta1.ArtifactGeneratorSpec) { s.OutputArtifacts[0].Name = "{app}-{region}" },
		"placeholder in from":       func(s *swv1beta1.ArtifactGeneratorSpec) { s.OutputArtifacts[0].Copy[0].From = "@repo/{team}/**" },
		"name never valid":          func(s *swv1beta1.ArtifactGeneratorSpec) { s.OutputArtifacts[0].Name = "{app}..x" },
		"escaping copy":             func(s *swv1beta1.ArtifactGeneratorSpec) { s.OutputArtifacts[0].Copy[0].To = "@artifact/../{app}" },
		"two templates of one name": func(s *swv1beta1.ArtifactGeneratorSpec) {
			s.OutputArtifacts = append(s.OutputArtifacts, s.OutputArtifacts[0])
		},
	} {
		t.Run(name, func(t *testing.T) {
			s := ok()
			mutate(s)
			if err := Validate(s); !errors.Is(err, ErrInvalid) {
				t.Errorf("err = %v, want ErrInvalid", err)
			}
		})
	}
}

func TestPatternExpand(t *testing.T) {
	p, err := ParsePattern("@repo/apps/{app}/envs/{env}")
	if err != nil {
		t.Fatal(err)
	}
	tmpl := []swv1beta1.OutputArtifact{{Name: "{app}-{env}", Copy: []swv1beta1.CopyOperation{
		{From: "@repo/apps/{app}/envs/{env}/**", To: "@artifact/{app}/", Exclude: []string{"*.md"}, Strategy: swv1beta1.MergeStrategy}}}}
	dirs := []string{"apps", "apps/Auth", "apps/Auth/envs", "apps/Auth/envs/dev", "apps/Auth/envs/dev/sub", "apps/pay", "apps/pay/envs",
		"apps/pay/envs/prod", "other"}
	outs, err := p.Expand(dirs, tmpl)
	if err != nil {
		t.Fatal(err)
	}
	want := []Output{
		{OutputArtifact: swv1beta1.OutputArtifact{Name: "auth-dev", Copy: []swv1beta1.CopyOperation{
			{From: "@repo/apps/Auth/envs/dev/**", To: "@artifact/Auth/", Exclude: []string{"*.md"}, Strategy: swv1beta1.MergeStrategy}}},
			Labels: map[string]string{"app": "auth", "env": "dev"}},
		{OutputArtifact: swv1beta1.OutputArtifact{Name: "pay-prod", Copy: []swv1beta1.CopyOperation{
			{From: "@repo/apps/pay/envs/prod/**", To: "@artifact/pay/", Exclude: []string{"*.md"}, Strategy: swv1beta1.MergeStrategy}}},
			Labels: map[string]string{"app": "pay", "env": "prod"}},
	}
	if !reflect.DeepEqual(outs, want) {
		t.Errorf("Expand =\n%+v\nwant\n%+v", outs, want)
	}
	if tmpl[0].Name != "{app}-{env}" || tmpl[0].Copy[0].From != "@repo/apps/{app}/envs/{env}/**" {
		t.Errorf("Expand changed its templates: %+v", tmpl[0])
	}
}

// TestRender replaces both placeholder forms, and leaves other braces.
func TestRender(t *testing.T) {
	got, err := render("{app}-{{ .env }}-{{.app}}/{a,b}", map[string]string{"app": "auth", "env": "dev"})
	if err != nil || got != "auth-dev-auth/{a,b}" {
		t.Errorf("render = %q, %v", got, err)
	}
	if _, err := render("{{ .team }}", map[string]string{"app": "auth"}); err == nil || !strings.Contains(err.Error(), "{team}") {
		t.Errorf("an unknown Go-template placeholder: %v", err)
	}
}

func TestPatternExpandFails(t *testing.T) {
	p, err := ParsePattern("@repo/apps/{app}")
	if err != nil {
		t.Fatal(err)
	}
	tmpl := []swv1beta1.OutputArtifact{{Name: "app-{app}", Copy: []swv1beta1.CopyOperation{cp("@repo/apps/{app}/**", "@artifact/")}}}
	for name, c := range map[string]struct {
		dirs []string
		want string
	}{
		"no match":          {[]string{"apps", "other/x"}, `pathPattern "@repo/apps/{app}" matches no directory in source "repo"`},
		"leading dot":       {[]string{"apps/.hidden"}, "not a valid Kubernetes label value"},
		"space":             {[]string{"apps/my app"}, "not a valid Kubernetes label value"},
		"too long":          {[]string{"apps/" + strings.Repeat("a", 64)}, "not a valid Kubernetes label value"},
		"underscore name":   {[]string{"apps/my_app"}, "not a valid Kubernetes object name"},
		"case collision":    {[]string{"apps/Auth", "apps/auth"}, "both resolve to artifact name"},
		"only files/parent": {[]string{"apps"}, "matches no directory"},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := p.Expand(c.dirs, tmpl)
			if !errors.Is(err, ErrBuild) || !strings.Contains(err.Error(), c.want) {
				t.Errorf("err = %v, want ErrBuild saying %q", err, c.want)
			}
		})
	}
	var nm *NoMatchError
	if _, err := p.Expand(nil, tmpl); !errors.As(err, &nm) || nm.Alias != "repo" {
		t.Errorf("no directories: err = %v, want a *NoMatchError for repo", err)
	}
}

// TestDirsRecord: every directory of the tree is seen, those of files'
// paths included, whatever the wrapped keep keeps.
func TestDirsRecord(t *testing.T) {
	d := Dirs{}
	keep := d.Record(func(name string, isDir bool) bool { return name == "a/b/c.yaml" })
	got := map[string]bool{}
	for _, e := range []struct {
		name  string
		isDir bool
	}{{"a/b/c.yaml", false}, {"x/y/z.yaml", false}, {"empty", true}, {"top.yaml", false}} {
		got[e.name] = keep(e.name, e.isDir)
	}
	if !got["a/b/c.yaml"] || got["x/y/z.yaml"] || got["empty"] {
		t.Errorf("keep answers %v, want the wrapped keep's", got)
	}
	if want := []string{"a", "a/b", "empty", "x", "x/y"}; !reflect.DeepEqual(d.Sorted(), want) {
		t.Errorf("dirs = %v, want %v", d.Sorted(), want)
	}
}

func TestNeededPattern(t *testing.T) {
	p, err := ParsePattern("@repo/apps/{app}")
	if err != nil {
		t.Fatal(err)
	}
	needed := Needed([]swv1beta1.OutputArtifact{{Name: "{app}", Copy: []swv1beta1.CopyOperation{
		cp("@repo/apps/{app}/manifests/**", "@artifact/"), cp("@cfg/values/{app}.yaml", "@artifact/values.yaml")}}}, p)
	for _, c := range []struct {
		alias, name string
		want        bool
	}{
		{"repo", "apps/a/manifests/x.yaml", true},
		{"repo", "docs/readme.md", false},
		{"cfg", "values/a.yaml", true},
		{"cfg", "other/a.yaml", false},
	} {
		if got := needed[c.alias].Keep(c.name, false); got != c.want {
			t.Errorf("Keep(%s, %s) = %v, want %v", c.alias, c.name, got, c.want)
		}
	}
}
