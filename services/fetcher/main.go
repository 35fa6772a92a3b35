// Command fetcher takes fetch jobs off NATS JetStream, fetches the sources
// they name (GitRepository, Bucket, OCIRepository, HelmRepository and HelmChart), stages their content in the shared
// storage and publishes the result: Fetched for the packager, or
// FetchUnchanged / FetchFailed for the artifact-server. Any number of
// replicas share the work.
//
// The headwater command runs it too, as headwater -target=fetcher (one image
// for every role).
package main

import (
	"os"

	"github.com/headwater-gitops/headwater/services/fetcher/role"
)

func main() { role.Main(os.Args[1:]) }
