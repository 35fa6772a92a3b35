// Command httpsource-fetcher fetches HTTPSources (source.headwater.dev/
// v1alpha1), Headwater's worked example of a plug-in source kind: it takes
// the watcher's HTTPSource jobs on headwater.jobs.fetch.httpsource as the
// bus identity plugin-httpsource, checks each URL with one conditional
// request, and stages new content for the packagers. See
// docs/writing-a-source-kind.md.
package main

import (
	"os"

	"github.com/headwater-gitops/headwater/services/httpsource-fetcher/role"
)

func main() { role.Main(os.Args[1:]) }
