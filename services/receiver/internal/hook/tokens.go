package hook

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	toolscache "k8s.io/client-go/tools/cache"

	"github.com/headwater-gitops/headwater/pkg/telemetry"
)

// DefaultSyncTimeout bounds how long a request waits for the first list
// of its Receiver's Secret.
const DefaultSyncTimeout = 10 * time.Second

// SecretWatches serves Receivers' tokens from watches of their Secrets.
// The first request for a Receiver starts a watch of the one Secret it
// names (a list and watch in the Receiver's namespace with the field
// selector metadata.name=<name>); later requests are answered from it, so
// a burst of hooks costs the API server nothing, and a rotated or deleted
// token is seen as soon as the watch tells it. A Secret no Receiver names
// any more is no longer watched (Prune). The receiver holds no other
// Secret, and of these the token only: an informer of every Secret would
// hold the cluster's credentials in an internet-facing pod.
type SecretWatches struct {
	// Client lists and watches the Secrets.
	Client kubernetes.Interface
	// SyncTimeout bounds a request's wait for a new watch's first list;
	// DefaultSyncTimeout when zero.
	SyncTimeout time.Duration

	mu      sync.Mutex
	watches map[types.NamespacedName]*secretWatch
	reads   prometheus.Counter
	watched prometheus.Gauge
}

// secretWatch is the informer of one Secret.
type secretWatch struct {
	informer toolscache.SharedIndexInformer
	stop     chan struct{}
}

// Register registers headwater_receiver_secret_reads_total and
// headwater_receiver_secret_watches on reg.
func (s *SecretWatches) Register(reg prometheus.Registerer) {
	s.reads = prometheus.NewCounter(prometheus.CounterOpts{
		Namespace: telemetry.Namespace, Name: "receiver_secret_reads_total",
		Help: "Watches of Receivers' token Secrets started or restarted, each of which reads the Secret once (changes arrive by the watch).",
	})
	s.watched = prometheus.NewGauge(prometheus.GaugeOpts{
		Namespace: telemetry.Namespace, Name: "receiver_secret_watches",
		Help: "Receivers' token Secrets watched (one watch each).",
	})
	reg.MustRegister(s.reads, s.watched)
}

// Token implements Tokens, with Flux's messages: the token of the Secret
// namespace/name as its watch last saw it.
func (s *SecretWatches) Token(ctx context.Context, namespace, name string) ([]byte, error) {
	key := types.NamespacedName{Namespace: namespace, Name: name}
	w := s.watch(key)
	timeout := s.SyncTimeout
	if timeout <= 0 {
		timeout = DefaultSyncTimeout
	}
	syncCtx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if !toolscache.WaitForCacheSync(syncCtx.Done(), w.informer.HasSynced) {
		return nil, fmt.Errorf("unable to read token from secret '%s': the watch did not list it within %s", key, timeout)
	}
	obj, ok, err := w.informer.GetStore().GetByKey(key.String())
	if err != nil {
		return nil, fmt.Errorf("unable to read token from secret '%s': %w", key, err)
	}
	if !ok {
		notFound := apierrors.NewNotFound(corev1.Resource("secrets"), name)
		return nil, fmt.Errorf("unable to read token from secret '%s': %w", key, errors.Join(ErrNoToken, notFound))
	}
	return tokenOf(key, obj.(*corev1.Secret))
}

// watch returns the watch of key, started if there is none.
func (s *SecretWatches) watch(key types.NamespacedName) *secretWatch {
	s.mu.Lock()
	defer s.mu.Unlock()
	if w, ok := s.watches[key]; ok {
		return w
	}
	selector := fields.OneTermEqualSelector("metadata.name", key.Name).String()
	secrets := s.Client.CoreV1().Secrets(key.Namespace)
	lw := &toolscache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			o.FieldSelector = selector
			return secrets.List(ctx, o)
		},
		// Each watch (re)started reads the Secret once, by a list before
		// it or in its initial events (a streaming list).
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			if s.reads != nil {
				s.reads.Inc()
			}
			o.FieldSelector = selector
			return secrets.Watch(ctx, o)
		},
	}
	inf := toolscache.NewSharedIndexInformer(lw, &corev1.Secret{}, 0, toolscache.Indexers{})
	// Only the token is kept.
	_ = inf.SetTransform(func(obj any) (any, error) {
		sec, ok := obj.(*corev1.Secret)
		if !ok {
			return obj, nil
		}
		kept := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: sec.Namespace, Name: sec.Name, ResourceVersion: sec.ResourceVersion}}
		if token, ok := sec.Data["token"]; ok {
			kept.Data = map[string][]byte{"token": token}
		}
		return kept, nil
	})
	w := &secretWatch{informer: inf, stop: make(chan struct{})}
	go inf.Run(w.stop)
	if s.watches == nil {
		s.watches = map[types.NamespacedName]*secretWatch{}
	}
	s.watches[key] = w
	if s.watched != nil {
		s.watched.Set(float64(len(s.watches)))
	}
	return w
}

// Prune stops the watches of the Secrets that named does not name (those
// of deleted Receivers, or of Receivers that name another Secret now).
func (s *SecretWatches) Prune(named func(types.NamespacedName) bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for key, w := range s.watches {
		if !named(key) {
			close(w.stop)
			delete(s.watches, key)
		}
	}
	if s.watched != nil {
		s.watched.Set(float64(len(s.watches)))
	}
}

// Watched returns how many Secrets are watched.
func (s *SecretWatches) Watched() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.watches)
}

// Stop stops every watch.
func (s *SecretWatches) Stop() { s.Prune(func(types.NamespacedName) bool { return false }) }
