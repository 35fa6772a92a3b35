package buildinfo

import (
	"runtime/debug"
	"strings"
	"testing"
)

func TestResolve(t *testing.T) {
	vcs := &debug.BuildInfo{GoVersion: "go1.26.0", Main: debug.Module{Version: "v0.2.0"}, Settings: []debug.BuildSetting{
		{Key: "vcs.revision", Value: "0123abc"}, {Key: "vcs.time", Value: "2026-01-02T03:04:05Z"}, {Key: "vcs.modified", Value: "true"},
	}}
	tests := []struct {
		name                    string
		version, revision, date string
		bi                      *debug.BuildInfo
		want                    Info
		line                    string
	}{{
		name: "stamped", version: "v0.1.0-3-gabc1234-dirty", revision: "abc1234", date: "2026-02-03T04:05:06Z", bi: vcs,
		want: Info{Version: "v0.1.0-3-gabc1234-dirty", Revision: "abc1234", BuildDate: "2026-02-03T04:05:06Z", GoVersion: "go1.26.0"},
		line: "v0.1.0-3-gabc1234-dirty (revision abc1234, built 2026-02-03T04:05:06Z, go1.26.0)",
	}, {
		name: "from the go build information", bi: vcs,
		want: Info{Version: "v0.2.0", Revision: "0123abc", Modified: true, BuildDate: "2026-01-02T03:04:05Z", GoVersion: "go1.26.0"},
		line: "v0.2.0 (revision 0123abc, modified, built 2026-01-02T03:04:05Z, go1.26.0)",
	}, {
		name: "nothing known", bi: &debug.BuildInfo{GoVersion: "go1.26.0", Main: debug.Module{Version: "(devel)"}},
		want: Info{Version: Devel, Revision: Unknown, GoVersion: "go1.26.0"},
		line: "devel (revision unknown, go1.26.0)",
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := resolve(tt.version, tt.revision, tt.date, tt.bi)
			if got != tt.want {
				t.Errorf("resolve = %+v, want %+v", got, tt.want)
			}
			if got.String() != tt.line {
				t.Errorf("String() = %q, want %q", got.String(), tt.line)
			}
		})
	}
}

func TestGet(t *testing.T) {
	got := Get()
	if got.Version == "" || got.Revision == "" || !strings.HasPrefix(got.GoVersion, "go") {
		t.Errorf("Get() = %+v, want every field but the date known or marked unknown", got)
	}
}
