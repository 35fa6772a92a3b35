package bench

import (
	"slices"
	"strings"
	"testing"
)

func TestMoveHost(t *testing.T) {
	urls := []string{"http://127.0.0.1:8080/a.git", "http://127.0.0.1:8080/sub/b.git"}
	if err := moveHost(urls, "http://127.0.0.1:8080", "http://127.0.0.2:9090"); err != nil {
		t.Fatal(err)
	}
	want := []string{"http://127.0.0.2:9090/a.git", "http://127.0.0.2:9090/sub/b.git"}
	if !slices.Equal(urls, want) {
		t.Errorf("moveHost: got %v, want %v", urls, want)
	}
	// A URL of another host, or of a host whose name merely starts with
	// from's, is refused rather than half-moved.
	for _, u := range []string{"http://example.com/a.git", "http://127.0.0.1:80800/a.git"} {
		if err := moveHost([]string{u}, "http://127.0.0.1:8080", "http://127.0.0.2:9090"); err == nil {
			t.Errorf("moveHost(%s): no error", u)
		}
	}
}

func TestFairLoadName(t *testing.T) {
	own := FairLoad{Big: 1000, Small: 10}.Name()
	same := FairLoad{Big: 1000, Small: 10, SameHost: true, UntilSmall: true}.Name()
	if own == same {
		t.Fatalf("the scenario's row does not say how its tenants are served: %q", own)
	}
	for _, c := range []struct{ name, want string }{
		{own, "a git host of its own"}, {same, "one git host"}, {same, "until the small tenant is Ready"},
	} {
		if !strings.Contains(c.name, c.want) {
			t.Errorf("row %q does not say %q", c.name, c.want)
		}
	}
}
