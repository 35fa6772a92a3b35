package results

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"k8s.io/apimachinery/pkg/types"
)

// KVOrder is an OrderStore in a JetStream key-value bucket
// (events.OrderBucket): one key per source UID, its value the request
// time of the newest job whose outcome was written, as RFC 3339 text (so
// `nats kv get` shows it).
type KVOrder struct {
	KV jetstream.KeyValue
}

var _ OrderStore = KVOrder{}

// Load returns source uid's entry, zero when it has none.
func (k KVOrder) Load(ctx context.Context, uid types.UID) (time.Time, error) {
	e, err := k.KV.Get(ctx, string(uid))
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return time.Time{}, nil
	}
	if err != nil {
		return time.Time{}, err
	}
	t, err := time.Parse(time.RFC3339Nano, string(e.Value()))
	if err != nil {
		// Not written by this code: as if there were none, which is
		// where every source starts.
		return time.Time{}, nil
	}
	return t, nil
}

// Store writes source uid's entry.
func (k KVOrder) Store(ctx context.Context, uid types.UID, requested time.Time) error {
	_, err := k.KV.Put(ctx, string(uid), []byte(requested.UTC().Format(time.RFC3339Nano)))
	return err
}

// Forget deletes source uid's entry; one that is not there is no error.
func (k KVOrder) Forget(ctx context.Context, uid types.UID) error {
	// The delete marker replaces the value (the bucket keeps one per
	// key) and expires with the bucket's TTL.
	if err := k.KV.Delete(ctx, string(uid)); err != nil && !errors.Is(err, jetstream.ErrKeyNotFound) {
		return fmt.Errorf("delete: %w", err)
	}
	return nil
}
