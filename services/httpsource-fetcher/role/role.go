// Package role is the httpsource-fetcher's main (Main), importable so that
// the httpsource-fetcher command and the headwater command (headwater
// -target=httpsource-fetcher) run the same service: the fetcher of
// HTTPSources, a plug-in source kind written with package sourcekit.
package role

import (
	"flag"
	"net/http"

	"github.com/headwater-gitops/headwater/pkg/egress"
	"github.com/headwater-gitops/headwater/pkg/sourcekit"
	"github.com/headwater-gitops/headwater/services/httpsource-fetcher/api/v1alpha1"
	"github.com/headwater-gitops/headwater/services/httpsource-fetcher/internal/httpsource"
)

// Main runs the fetcher with args, the command line after the program's
// name (or after -target), and exits the process when it ends. Besides
// sourcekit's flags it takes -max-size, the most bytes one HTTPSource may
// download or extract.
func Main(args []string) {
	sourcekit.Main(kind(), args)
}

// Flags returns the fetcher's flags as Main parses them, bound to options
// of their own: for tests and the flag reference (docs/flags.md).
func Flags() *flag.FlagSet { return sourcekit.Flags(kind()) }

// kind is the HTTPSource fetcher, with its flags.
func kind() sourcekit.Kind {
	// The URLs are tenants': the client follows the egress policy
	// sourcekit.Run installs.
	f := &httpsource.Fetcher{Client: &http.Client{Transport: egress.Transport()}}
	return sourcekit.Kind{
		Name:  v1alpha1.HTTPSourceKind,
		Fetch: f.Fetch,
		BindFlags: func(fs *flag.FlagSet) {
			fs.Int64Var(&f.MaxSize, "max-size", 256<<20, "Most bytes one HTTPSource may download, and extract from a tarball.")
		},
	}
}
