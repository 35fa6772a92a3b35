package natsserver_test

import (
	"testing"

	"github.com/headwater-gitops/headwater/testsupport/natsserver"
)

func TestStartNeedsStoreDir(t *testing.T) {
	if _, err := natsserver.Start(natsserver.Options{}); err == nil {
		t.Fatal("no error without a store directory")
	}
}

func TestStartServesJetStream(t *testing.T) {
	ns, err := natsserver.Start(natsserver.Options{StoreDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ns.Shutdown(); ns.WaitForShutdown() })
	if !ns.JetStreamEnabled() {
		t.Error("JetStream is not enabled")
	}
	if ns.ClientURL() == "" {
		t.Error("no client URL")
	}
}
