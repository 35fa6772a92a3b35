package hook

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
)

// TestSecretWatches, against a real API server: a burst of requests reads
// the Receiver's Secret once (one watch) and no other Secret is held; a rotated, an
// emptied and a deleted token are seen by the watch without a read; a
// Secret no Receiver names any more is no longer watched.
func TestSecretWatches(t *testing.T) {
	if os.Getenv("KUBEBUILDER_ASSETS") == "" {
		t.Fatal("KUBEBUILDER_ASSETS is not set: run the tests with `make test`, which builds kube-apiserver and etcd")
	}
	testEnv := &envtest.Environment{}
	cfg, err := testEnv.Start()
	if err != nil {
		_ = testEnv.Stop()
		t.Fatalf("start control plane: %v", err)
	}
	t.Cleanup(func() { _ = testEnv.Stop() })
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	secrets := cs.CoreV1().Secrets("default")
	for name, token := range map[string]string{"webhook-token": "s3cret", "other": "not-ours"} {
		if _, err := secrets.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: name},
			Data: map[string][]byte{"token": []byte(token), "unrelated": []byte("x")}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}

	w := &SecretWatches{Client: cs}
	w.Register(prometheus.NewRegistry())
	defer w.Stop()
	for range 20 {
		token, err := w.Token(ctx, "default", "webhook-token")
		if err != nil || string(token) != "s3cret" {
			t.Fatalf("Token = %q, %v; want s3cret", token, err)
		}
	}
	if n := testutil.ToFloat64(w.reads); n != 1 {
		t.Errorf("%v watches for 20 requests, want 1", n)
	}
	// Only the one Secret, and of it only the token.
	held := w.watches[types.NamespacedName{Namespace: "default", Name: "webhook-token"}].informer.GetStore().List()
	if len(held) != 1 {
		t.Fatalf("the watch holds %d objects, want 1", len(held))
	}
	if sec := held[0].(*corev1.Secret); len(sec.Data) != 1 || sec.Name != "webhook-token" {
		t.Errorf("held %s with keys %v, want webhook-token's token only", sec.Name, sec.Data)
	}

	update := func(token []byte) {
		t.Helper()
		sec, err := secrets.Get(ctx, "webhook-token", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		sec.Data["token"] = token
		if _, err := secrets.Update(ctx, sec, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	update([]byte("rotated"))
	eventually(t, "the rotated token", func() error {
		token, err := w.Token(ctx, "default", "webhook-token")
		if err != nil || string(token) != "rotated" {
			return fmt.Errorf("Token = %q, %v", token, err)
		}
		return nil
	})
	update([]byte{})
	eventually(t, "the emptied token refused", func() error {
		if _, err := w.Token(ctx, "default", "webhook-token"); !errors.Is(err, ErrNoToken) || !strings.Contains(err.Error(), "field 'token' is empty") {
			return fmt.Errorf("Token: %v", err)
		}
		return nil
	})
	if err := secrets.Delete(ctx, "webhook-token", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	want := `unable to read token from secret 'default/webhook-token': no token` + "\n" + `secrets "webhook-token" not found`
	eventually(t, "the deleted Secret", func() error {
		if _, err := w.Token(ctx, "default", "webhook-token"); !errors.Is(err, ErrNoToken) || err.Error() != want {
			return fmt.Errorf("Token: %v", err)
		}
		return nil
	})
	if n := testutil.ToFloat64(w.reads); n != 1 {
		t.Errorf("%v watches, want 1: changes come by the watch", n)
	}

	// A second Secret, then no Receiver names the first.
	if _, err := w.Token(ctx, "default", "other"); err != nil {
		t.Fatal(err)
	}
	w.Prune(func(key types.NamespacedName) bool { return key.Name == "other" })
	if n := w.Watched(); n != 1 || testutil.ToFloat64(w.watched) != 1 {
		t.Errorf("%d watched after the prune, want 1", n)
	}
}

// eventually polls check until it returns nil, failing t after 10 s.
func eventually(t *testing.T, what string, check func() error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	for {
		err := check()
		if err == nil {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("%s: %v", what, err)
		case <-time.After(20 * time.Millisecond):
		}
	}
}
