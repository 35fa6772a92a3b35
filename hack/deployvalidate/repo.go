package deployvalidate

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// Services are Headwater's services: each is built from services/<name>
// (its flags in services/<name>/role), runs from the one headwater image
// with -target=<name> and in a container of the same name.
var Services = []string{"watcher", "fetcher", "packager", "artifact-server"}

// OptionalServices are built and run like Services, but deployed by a
// component of their own: the webhook receiver (components/receivers, the
// compose profile "receivers"), the dispatcher (components/dispatcher) and
// the HTTPSource plug-in kind's fetcher (components/httpsource, the
// compose profile "httpsource").
var OptionalServices = []string{"receiver", "dispatcher", "httpsource-fetcher"}

// Identity is the bus identity a service connects as (its NKey seed file
// is <identity>.nk): its name, but for a plug-in kind's fetcher, whose
// identity is plugin-<kind> (events.PluginIdentity).
func Identity(service string) string {
	if kind, ok := strings.CutSuffix(service, "-fetcher"); ok && service != "fetcher" {
		return "plugin-" + kind
	}
	return service
}

// Commands are built like Services (services/<name>, in the headwater
// image) but run to completion: the setup Job of deploy/base.
var Commands = []string{"setup"}

// IsService reports whether name is one of Services, OptionalServices or
// Commands: a Headwater binary whose flags the checks know.
func IsService(name string) bool {
	return slices.Contains(slices.Concat(Services, OptionalServices, Commands), name)
}

// The images deploy/ runs: Headwater's, one registry and one tag (what
// `make images` builds, IMAGE_REGISTRY and IMAGE_TAG in the Makefile),
// and the two third-party servers.
const (
	ImageRegistry = "ghcr.io/headwater-gitops"
	ImageTag      = "v0.1.0"
	NATSImage     = "nats:2.15.2"
	MinIOImage    = "quay.io/minio/minio:RELEASE.2026-02-12T20-18-48Z"
)

// HeadwaterImage is the image of every Headwater service and command:
// -target, its first argument, picks the one a container runs.
const HeadwaterImage = ImageRegistry + "/headwater:" + ImageTag

// Images is every image a manifest may name.
func Images() []string { return []string{HeadwaterImage, NATSImage, MinIOImage} }

// RepoRoot returns the repository root: the nearest directory at or above
// dir that holds go.work.
func RepoRoot(dir string) (string, error) {
	dir, err := filepath.Abs(dir)
	if err != nil {
		return "", fmt.Errorf("repository root: %w", err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.work")); err == nil {
			return dir, nil
		} else if !errors.Is(err, os.ErrNotExist) {
			return "", fmt.Errorf("repository root: %w", err)
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("repository root: no go.work above the working directory")
		}
		dir = parent
	}
}
