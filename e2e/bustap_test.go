package e2e

import (
	"bytes"
	"context"
	"encoding/base64"
	"fmt"
	"slices"
	"strings"
	"sync"

	"github.com/nats-io/nats.go"
	corev1 "k8s.io/api/core/v1"

	"github.com/headwater-gitops/headwater/e2e/harness"
	"github.com/headwater-gitops/headwater/testsupport/natsserver"
)

// credentialKeys are the Secret keys whose values are credentials in the
// Secrets Flux sources name: Git (basic auth, bearer token, SSH key, client
// certificate), proxies, Buckets and registries.
var credentialKeys = []string{"username", "password", "bearerToken", "identity", "tls.key", "accesskey", "secretkey",
	"token", ".dockerconfigjson"}

// urlCredentials are the credentials tests put in source URLs, which
// checkNoCredentials looks for on the bus beside the Secrets' credentials.
var urlCredentials sync.Map

// urlCredential returns a credential for the URL of the test source name,
// registered for the bus tap to look for.
func urlCredential(name string) string {
	token := "url-token-" + name + "-s3cr3t"
	urlCredentials.Store(token, name)
	return token
}

// busTap records every message that crosses the bus during the run, on every
// subject (jobs, results, public events, JetStream's own API), as an
// administrator sees them.
type busTap struct {
	nc *nats.Conn

	mu       sync.Mutex
	messages int
	data     bytes.Buffer
}

// startTap subscribes to every subject of env's bus.
func startTap(env *harness.Env) (*busTap, error) {
	auth, err := env.NATSOption(natsserver.Admin)
	if err != nil {
		return nil, err
	}
	nc, err := nats.Connect(env.NATSURL, auth, nats.Name("headwater-e2e-tap"))
	if err != nil {
		return nil, fmt.Errorf("bus tap: %w", err)
	}
	t := &busTap{nc: nc}
	if _, err := nc.Subscribe(">", t.record); err != nil {
		nc.Close()
		return nil, fmt.Errorf("bus tap: %w", err)
	}
	if err := nc.Flush(); err != nil {
		nc.Close()
		return nil, fmt.Errorf("bus tap: %w", err)
	}
	return t, nil
}

func (t *busTap) record(m *nats.Msg) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.messages++
	t.data.WriteString(m.Subject)
	t.data.WriteByte('\n')
	for k, vs := range m.Header {
		t.data.WriteString(k + ": " + strings.Join(vs, ",") + "\n")
	}
	t.data.Write(m.Data)
	t.data.WriteByte('\n')
}

// checkNoCredentials stops the tap and reports every credential of every
// Secret in the cluster (the tests' Git, proxy, Bucket and registry
// credentials) and every credential a test put in a source's URL
// (urlCredential) that appeared on the bus, as it is or base64-encoded, by
// Secret and key or by source, never by value. With full (the whole suite ran), a run
// that put no credential to the test is an error too.
func (t *busTap) checkNoCredentials(ctx context.Context, env *harness.Env, full bool) error {
	if err := t.nc.Drain(); err != nil {
		t.nc.Close()
	}
	var secrets corev1.SecretList
	if err := env.Client.List(ctx, &secrets); err != nil {
		return fmt.Errorf("bus tap: list secrets: %w", err)
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	var leaks []string
	checked := 0
	seen := func(v []byte) bool {
		checked++
		return bytes.Contains(t.data.Bytes(), v) || bytes.Contains(t.data.Bytes(), []byte(base64.StdEncoding.EncodeToString(v)))
	}
	for _, s := range secrets.Items {
		for k, v := range s.Data {
			if !slices.Contains(credentialKeys, k) || len(v) < 6 {
				continue
			}
			if seen(v) {
				leaks = append(leaks, s.Namespace+"/"+s.Name+"["+k+"]")
			}
		}
	}
	urlCredentials.Range(func(token, source any) bool {
		if seen([]byte(token.(string))) {
			leaks = append(leaks, "the URL of "+source.(string))
		}
		return true
	})
	if len(leaks) > 0 {
		return fmt.Errorf("bus tap: %d credentials of %d appeared on the bus in %d messages: %s",
			len(leaks), checked, t.messages, strings.Join(leaks, ", "))
	}
	if full && (checked == 0 || t.messages == 0) {
		return fmt.Errorf("bus tap: checked %d credentials against %d messages: the run exercised nothing", checked, t.messages)
	}
	fmt.Printf("e2e: bus tap: none of %d credentials in %d messages on the bus\n", checked, t.messages)
	return nil
}
