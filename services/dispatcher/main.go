// Command dispatcher delivers Headwater's public CloudEvents to the
// Subscriptions (events.headwater.dev/v1alpha1) that ask for them: to HTTP
// endpoints in the CloudEvents HTTP binding, signed and retried, or into
// durable NATS consumers. It reads Subscriptions and the Secrets they name,
// and writes nothing to Kubernetes: it reports deliveries and dead letters
// on the bus, and the watcher keeps the Subscriptions' status. Any number of
// replicas run, all active.
//
// The headwater command runs it too, as headwater -target=dispatcher (one image
// for every role).
package main

import (
	"os"

	"github.com/headwater-gitops/headwater/services/dispatcher/role"
)

func main() { role.Main(os.Args[1:]) }
