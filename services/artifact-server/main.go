// Command artifact-server serves Headwater's shared artifact storage over
// HTTP, as Flux's source-controller does, and announces every job result on
// the bus as a public CloudEvent with the artifact's download URL.
//
// The headwater command runs it too, as headwater -target=artifact-server (one image
// for every role).
package main

import (
	"os"

	"github.com/headwater-gitops/headwater/services/artifact-server/role"
)

func main() { role.Main(os.Args[1:]) }
