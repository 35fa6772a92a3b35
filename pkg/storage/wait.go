package storage

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/go-logr/logr"
	"github.com/minio/minio-go/v7"

	"github.com/headwater-gitops/headwater/pkg/telemetry"
)

// ReadyName is the readiness check OpenReady sets: the services whose
// readiness follows their storage declare it waiting ("not opened yet")
// until then.
const ReadyName = "storage"

// OpenReady opens the storage as OpenWait does, for a service whose
// readiness follows it: while OpenWait waits, ready's check ReadyName
// fails with what the object store answered; once open, it pings the
// store (ReadyCheck, within 5 s).
func (o *Options) OpenReady(ctx context.Context, log logr.Logger, ready *telemetry.Checks) (Storage, error) {
	store, err := o.OpenWait(ctx, log, func(err error) {
		ready.Set(ReadyName, func() error { return fmt.Errorf("waiting for the object store: %w", err) })
	})
	if err != nil {
		return nil, err
	}
	ready.Set(ReadyName, ReadyCheck(store, 5*time.Second))
	return store, nil
}

// openBackoff bounds the waits between attempts of OpenWait.
const (
	openFirstWait = time.Second
	openMaxWait   = 5 * time.Second
)

// OpenWait opens the storage as OpenContext does, waiting for an object
// store that cannot be reached yet (refused, not resolvable, timing out,
// or answering 503 while it starts, as a MinIO started beside the service
// does) instead of failing: it tries again after 1 s, then up to every 5 s,
// logs each failed attempt and passes its error to report (the service's
// readiness check), until ctx ends. A storage that answers and refuses
// (wrong credentials, no such bucket) fails at once, as a wrong flag does.
func (o *Options) OpenWait(ctx context.Context, log logr.Logger, report func(error)) (Storage, error) {
	wait := openFirstWait
	for attempt := 1; ; attempt++ {
		s, err := o.OpenContext(ctx)
		if err == nil || !unreachable(err) {
			return s, err
		}
		if report != nil {
			report(err)
		}
		log.Info("waiting for storage", "attempt", attempt, "retryIn", wait.String(), "error", err.Error())
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("storage: gave up waiting: %w", errors.Join(ctx.Err(), err))
		case <-time.After(wait):
		}
		wait = min(2*wait, openMaxWait)
	}
}

// unreachable tells whether err says the storage could not be reached, or
// is not serving yet, rather than that it refused.
func unreachable(err error) bool {
	var netErr net.Error
	if errors.As(err, &netErr) {
		return true
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return true
	}
	var resp minio.ErrorResponse
	if errors.As(err, &resp) {
		return resp.StatusCode == http.StatusServiceUnavailable || resp.Code == "XMinioServerNotInitialized"
	}
	return false
}
