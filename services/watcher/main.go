// Command watcher is Headwater's Kubernetes-facing service: it watches the
// Flux source objects, turns them and their intervals into fetch jobs on the
// bus, and applies job outcomes to their status and Events. It is the only
// Headwater service that writes to the Kubernetes API. Replicas elect a
// leader; a standby takes over without losing a source.
//
// The headwater command runs it too, as headwater -target=watcher (one image
// for every role).
package main

import (
	"os"

	"github.com/headwater-gitops/headwater/services/watcher/role"
)

func main() { role.Main(os.Args[1:]) }
