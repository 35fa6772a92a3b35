// Package bench measures Headwater on real parts (the harness's Env: a local
// kube-apiserver and etcd, embedded NATS, directory storage, a smart-HTTP
// git server and the four service binaries) in the scenarios Flux's
// source-controller v1.9 was measured in on this kind of machine, and
// prints a table that puts Headwater's numbers beside Flux's reference
// numbers.
//
// Flux itself cannot be built here, so its column holds the reference
// numbers measured earlier, not numbers measured in the same run.
//
// The work runs only under `go test -bench` (`make bench`); a plain
// `go test` runs the fast unit tests of the measuring helpers only.
package bench
