// Package deployvalidate checks Headwater's deployment files against the
// code they run: the docker-compose.yaml at the top of the repository, the
// kustomize tree under deploy/ (and its overlays) and the Dockerfile.
//
// Its tests load the compose file with compose-go, build the kustomizations
// with kustomize's krusty, decode every resource strictly into the
// Kubernetes API types, and check, among other things, that every
// HEADWATER_* environment variable and every command-line argument given to
// a service names a flag that service really registers. Flags are found by
// reading the services' sources (see FlagSet), so a renamed flag breaks the
// tests rather than a deployment.
//
// The module is outside the go.work workspace; run it with
//
//	cd hack/deployvalidate && GOWORK=off go test ./...
package deployvalidate
