// Command receiver is Headwater's webhook receiver: it serves Flux's
// /hook/<digest> endpoint for Receivers (notification.toolkit.fluxcd.io/v1),
// validates each request as Flux's notification-controller does, and
// publishes the hooks it accepts on the bus for the watcher, which turns
// them into fetch jobs. It is internet-facing, so it holds the least
// rights: it lists and watches Receivers, gets the one Secret a request
// needs, and may only publish hooks on the bus.
//
// The headwater command runs it too, as headwater -target=receiver (one image
// for every role).
package main

import (
	"os"

	"github.com/headwater-gitops/headwater/services/receiver/role"
)

func main() { role.Main(os.Args[1:]) }
