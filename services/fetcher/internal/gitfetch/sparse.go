package gitfetch

import (
	"path"
	"strings"
)

// sparseDirs turns spec.sparseCheckout into the path prefixes go-git checks
// out, nil for the whole tree. As in Flux, a leading "./" is dropped; unlike
// a plain prefix, each directory ends in "/", so that "deploy" checks out
// deploy/ only, not deploy-staging/ or deployment.yaml beside it. A
// directory naming the root ("." or "/") checks out everything.
func sparseDirs(spec []string) []string {
	var dirs []string
	for _, d := range spec {
		d = strings.TrimPrefix(path.Clean("/"+strings.TrimPrefix(d, "./")), "/")
		if d == "" {
			return nil
		}
		dirs = append(dirs, d+"/")
	}
	return dirs
}
