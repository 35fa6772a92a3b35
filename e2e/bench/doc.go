// Package bench measures Headwater and Flux's source-controller side by
// side on real parts (the harness's Env: a local kube-apiserver and etcd, a
// smart-HTTP git server, the CNCF distribution registry, a chart
// repository, MinIO) and prints a table of both, their ratios and
// Headwater's targets.
//
// Every scenario runs twice, each time on a fresh Env: once with
// Headwater's four services and NATS (each its own process, so each is
// measured), once with Flux's source-controller (built from its module by
// `make flux`) and no Headwater process. The numbers of both columns come
// from the same run on the same machine; nothing is typed in.
//
// The work runs only under `go test -bench` (`make bench`); a plain
// `go test` runs the fast unit tests of the measuring helpers only.
package bench
