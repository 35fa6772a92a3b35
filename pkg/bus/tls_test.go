package bus_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/go-logr/logr"

	"github.com/headwater-gitops/headwater/pkg/bus"
	"github.com/headwater-gitops/headwater/pkg/events"
	"github.com/headwater-gitops/headwater/testsupport/natsserver"
	"github.com/headwater-gitops/headwater/testsupport/testca"
)

// TestTLS runs a real NATS server that requires TLS with client
// certificates (as deploy/components/nats-tls configures it) and Headwater's
// identities: a service connecting with -nats-ca, -nats-cert and -nats-key
// joins the bus and publishes; a plaintext client, a client without a
// certificate and one that trusts another authority are refused.
func TestTLS(t *testing.T) {
	dir := t.TempDir()
	write := func(name string, b []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, b, 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	ca := &testca.Lazy{Name: "nats"}
	serverTLS, err := ca.ServerConfig("nats", true)
	if err != nil {
		t.Fatal(err)
	}
	caPEM, err := ca.CACert()
	if err != nil {
		t.Fatal(err)
	}
	certPEM, keyPEM, err := ca.ClientCert("packager")
	if err != nil {
		t.Fatal(err)
	}
	other := &testca.Lazy{Name: "other"}
	otherPEM, err := other.CACert()
	if err != nil {
		t.Fatal(err)
	}
	caFile, certFile, keyFile := write("ca.crt", caPEM), write("tls.crt", certPEM), write("tls.key", keyPEM)
	otherCAFile := write("other-ca.crt", otherPEM)

	ids, err := natsserver.NewIdentities(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	ns, err := natsserver.Start(natsserver.Options{StoreDir: t.TempDir(), Users: ids.Users, TLS: serverTLS})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ns.Shutdown(); ns.WaitForShutdown() })
	url := ns.ClientURL()
	nkey := ids.SeedFiles[events.PackagerIdentity]

	tests := []struct {
		name string
		opts bus.Options
		ok   bool
	}{
		{"tls with a client certificate", bus.Options{URL: url, NKeyFile: nkey, CAFile: caFile, CertFile: certFile, KeyFile: keyFile}, true},
		{"plaintext", bus.Options{URL: url, NKeyFile: nkey}, false},
		{"tls without a client certificate", bus.Options{URL: url, NKeyFile: nkey, CAFile: caFile}, false},
		{"another authority", bus.Options{URL: url, NKeyFile: nkey, CAFile: otherCAFile, CertFile: certFile, KeyFile: keyFile}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			// Connect retries until its context ends: a refused client
			// is one still refused after a few attempts.
			timeout := 3 * time.Second
			if tt.ok {
				timeout = 30 * time.Second
			}
			ctx, cancel := context.WithTimeout(context.Background(), timeout)
			defer cancel()
			c, err := bus.Connect(ctx, tt.opts, events.PackagerIdentity, logr.Discard())
			if !tt.ok {
				if err == nil {
					c.Close()
					t.Fatal("connected")
				}
				return
			}
			if err != nil {
				t.Fatalf("connect over TLS: %v", err)
			}
			defer c.Close()
			if _, err := c.NC.TLSConnectionState(); err != nil {
				t.Error("the connection is not TLS")
			}
			if _, err := c.JoinStream(ctx, events.PackageStream, events.PackagerConsumer, events.ConsumerOptions{}); err != nil {
				t.Fatalf("join the package stream over TLS: %v", err)
			}
			job := events.Job{ID: "tls", Object: events.ObjectRef{Kind: "GitRepository", Namespace: "default", Name: "tls", UID: "u"}}
			if err := c.NewPublisher(events.PackagerIdentity).Publish(ctx, events.PublishSubject("GitRepository"),
				events.TypePackaged, job, &events.Outcome{Job: job}); err != nil {
				t.Fatalf("publish over TLS: %v", err)
			}
		})
	}
}
