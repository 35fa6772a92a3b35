//go:build tools

// Package tools pins the Kubernetes commands hack/build-tools.sh builds from
// this scratch module: the control plane envtest runs (kube-apiserver,
// kubectl) and the node components the cluster tests run (kubelet,
// kube-proxy, kube-scheduler, kube-controller-manager). The build tag keeps
// it out of every build; `go mod tidy` still records their dependencies.
package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-proxy"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubectl"
	_ "k8s.io/kubernetes/cmd/kubelet"
)
