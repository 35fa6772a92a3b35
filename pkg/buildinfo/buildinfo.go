// Package buildinfo says which build of a Headwater service is running: the
// version, commit and build date that `make build` and the Dockerfile stamp
// into the binary with -ldflags -X, or, where they were not stamped (a plain
// `go build` or `go install`), what the Go toolchain recorded in it.
package buildinfo

import (
	"fmt"
	"runtime"
	"runtime/debug"
	"strings"
	"sync"
)

// Stamped at build time, for example:
//
//	go build -ldflags "-X github.com/headwater-gitops/headwater/pkg/buildinfo.Version=v0.1.0 ..."
//
// Empty means not stamped; Get then falls back to the Go build information.
var (
	// Version is the release, as `git describe --tags --always --dirty`
	// prints it.
	Version string
	// Revision is the full commit hash the binary was built from.
	Revision string
	// BuildDate is when the binary was built, in RFC 3339.
	BuildDate string
)

// Unknown stands for a revision the binary does not know.
const Unknown = "unknown"

// Devel stands for the version of a binary built without one.
const Devel = "devel"

// Info describes the running binary.
type Info struct {
	// Version is the stamped version, else the main module's version;
	// Devel when neither is known.
	Version string
	// Revision is the stamped commit, else vcs.revision; Unknown when
	// neither is known.
	Revision string
	// Modified reports that vcs.revision had uncommitted changes on top
	// (vcs.modified). A stamped version says so itself with "-dirty".
	Modified bool
	// BuildDate is the stamped build date, else the commit time (vcs.time);
	// empty when neither is known.
	BuildDate string
	// GoVersion is the Go release that built the binary.
	GoVersion string
}

// Get returns the running binary's build information.
var Get = sync.OnceValue(func() Info {
	bi, _ := debug.ReadBuildInfo()
	return resolve(Version, Revision, BuildDate, bi)
})

// resolve prefers the stamped values and fills the rest from bi, which may
// be nil.
func resolve(version, revision, date string, bi *debug.BuildInfo) Info {
	info := Info{Version: version, Revision: revision, BuildDate: date, GoVersion: runtime.Version()}
	if bi != nil {
		info.GoVersion = bi.GoVersion
		if info.Version == "" && bi.Main.Version != "(devel)" {
			info.Version = bi.Main.Version
		}
		vcs := map[string]string{}
		for _, s := range bi.Settings {
			vcs[s.Key] = s.Value
		}
		if info.Revision == "" {
			info.Revision = vcs["vcs.revision"]
			info.Modified = vcs["vcs.modified"] == "true"
		}
		if info.BuildDate == "" {
			info.BuildDate = vcs["vcs.time"]
		}
	}
	if info.Version == "" {
		info.Version = Devel
	}
	if info.Revision == "" {
		info.Revision = Unknown
	}
	return info
}

// String is the version, then the rest in parentheses:
// "v0.1.0-3-gabc1234 (revision abc1234..., built 2026-01-02T03:04:05Z, go1.26.0)".
func (i Info) String() string {
	details := []string{"revision " + i.Revision}
	if i.Modified {
		details = append(details, "modified")
	}
	if i.BuildDate != "" {
		details = append(details, "built "+i.BuildDate)
	}
	details = append(details, i.GoVersion)
	return fmt.Sprintf("%s (%s)", i.Version, strings.Join(details, ", "))
}
