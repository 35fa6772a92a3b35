// Command packager turns the content fetchers stage into artifacts: it reads
// Fetched and DeleteRequested jobs from the package stream, writes canonical
// tar.gz artifacts with their digest to the shared storage, keeps the latest
// pointer and the retention policy, and publishes the results.
//
// The headwater command runs it too, as headwater -target=packager (one image
// for every role).
package main

import (
	"os"

	"github.com/headwater-gitops/headwater/services/packager/role"
)

func main() { role.Main(os.Args[1:]) }
