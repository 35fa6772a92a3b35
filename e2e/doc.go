// Package e2e holds Headwater's end-to-end tests: the four service binaries
// run as separate processes against a real kube-apiserver and etcd, embedded
// NATS JetStream, directory storage and a real git server (see package
// harness), and the tests check what a user sees, field by field.
//
// Run them with `make test`, which builds the binaries first. With -short
// (`make test-unit`) they are skipped; without the binaries they fail.
package e2e
