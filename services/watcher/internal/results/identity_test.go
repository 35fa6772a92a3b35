package results

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"testing"

	"github.com/go-logr/logr"
)

// TestObjectIdentity: an outcome's log line names the object with the keys
// of a controller-runtime reconcile, which `flux logs` (flux2
// cmd/flux/logs.go) decodes and filters on.
func TestObjectIdentity(t *testing.T) {
	var buf bytes.Buffer
	log := logr.FromSlogHandler(slog.NewJSONHandler(&buf, nil))
	log.WithValues(ObjectIdentity("GitRepository", "flux-system", "podinfo")...).Info("stored artifact")

	var flux struct {
		ControllerKind string `json:"controllerKind"`
		Name           string `json:"name"`
		Namespace      string `json:"namespace"`
	}
	if err := json.Unmarshal(buf.Bytes(), &flux); err != nil {
		t.Fatalf("flux logs cannot decode %s: %v", buf.String(), err)
	}
	if flux.ControllerKind != "GitRepository" || flux.Name != "podinfo" || flux.Namespace != "flux-system" {
		t.Errorf("decoded %+v from %s", flux, buf.String())
	}
	var raw struct {
		Controller string `json:"controller"`
		Object     struct {
			Name, Namespace string
		} `json:"GitRepository"`
	}
	if err := json.Unmarshal(buf.Bytes(), &raw); err != nil {
		t.Fatal(err)
	}
	if raw.Controller != "gitrepository" || raw.Object.Name != "podinfo" || raw.Object.Namespace != "flux-system" {
		t.Errorf("controller %q, object %+v; want controller-runtime's gitrepository and {podinfo flux-system}", raw.Controller, raw.Object)
	}
}
