package kubeconfig

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestLoad(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "kubeconfig")
	if err := os.WriteFile(good, []byte(`apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://203.0.113.7:6443"}}]
users: [{name: u, user: {token: t0k3n}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
`), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := Load(good)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Host != "https://203.0.113.7:6443" || cfg.BearerToken != "t0k3n" {
		t.Errorf("Load(%s) = host %q token %q", good, cfg.Host, cfg.BearerToken)
	}
	if _, err := Load(filepath.Join(dir, "missing")); err == nil || !strings.Contains(err.Error(), "kubeconfig "+filepath.Join(dir, "missing")) {
		t.Errorf("a missing file: %v, want an error naming it", err)
	}
	t.Setenv("KUBECONFIG", good)
	if cfg, err := Load(""); err != nil || cfg.Host != "https://203.0.113.7:6443" {
		t.Errorf("Load with $KUBECONFIG: %v, %v", cfg, err)
	}
}
