package storage_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr"

	"github.com/headwater-gitops/headwater/pkg/storage"
	"github.com/headwater-gitops/headwater/pkg/telemetry"
	"github.com/headwater-gitops/headwater/testsupport/miniotest"
)

// TestOpenWait opens S3 storage through a proxy to a real MinIO that first
// answers as a MinIO still starting does (503, XMinioServerNotInitialized):
// OpenWait reports each such attempt and opens once MinIO serves, while a
// MinIO that refuses the credentials fails at once, reported never.
func TestOpenWait(t *testing.T) {
	srv := miniotest.New(t)
	srv.MakeBucket(t, "artifacts")
	target, err := url.Parse(srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	var starting atomic.Int32
	starting.Store(2)
	proxy := httputil.NewSingleHostReverseProxy(target)
	front := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if starting.Add(-1) >= 0 {
			w.Header().Set("Content-Type", "application/xml")
			w.WriteHeader(http.StatusServiceUnavailable)
			_, _ = w.Write([]byte(`<?xml version="1.0" encoding="UTF-8"?><Error><Code>XMinioServerNotInitialized</Code><Message>Server not initialized yet, please try again.</Message></Error>`))
			return
		}
		// The proxy keeps the Host header the request was signed for.
		proxy.ServeHTTP(w, r)
	}))
	defer front.Close()

	open := func(endpoint, secret string) (storage.Storage, []error, error) {
		o := storage.Options{Backend: "s3", S3: storage.S3Options{
			Endpoint: endpoint, Bucket: "artifacts", AccessKey: srv.AccessKey, SecretKey: secret, Insecure: true,
		}}
		var reported []error
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		s, err := o.OpenWait(ctx, logr.Discard(), func(err error) { reported = append(reported, err) })
		return s, reported, err
	}

	t.Run("starting", func(t *testing.T) {
		s, reported, err := open(strings.TrimPrefix(front.URL, "http://"), srv.SecretKey)
		if err != nil {
			t.Fatalf("OpenWait: %v", err)
		}
		defer storage.Close(s)
		if len(reported) != 2 {
			t.Fatalf("reported %d attempts (%v), want the 2 that MinIO answered 503", len(reported), reported)
		}
		if !strings.Contains(reported[0].Error(), "not initialized") {
			t.Errorf("reported %q, want MinIO's reason", reported[0])
		}
	})
	t.Run("wrong credentials", func(t *testing.T) {
		_, reported, err := open(srv.Endpoint, "wrong-secret")
		if err == nil {
			t.Fatal("OpenWait with a wrong secret succeeded")
		}
		if len(reported) != 0 {
			t.Errorf("a refusal was waited on: reported %v", reported)
		}
	})
	t.Run("gives up with its context", func(t *testing.T) {
		front.Close() // nothing listens any more
		o := storage.Options{Backend: "s3", S3: storage.S3Options{Endpoint: strings.TrimPrefix(front.URL, "http://"), Bucket: "artifacts", AccessKey: "k", SecretKey: "s", Insecure: true}}
		ctx, cancel := context.WithTimeout(context.Background(), 2500*time.Millisecond)
		defer cancel()
		var n int
		_, err := o.OpenWait(ctx, logr.Discard(), func(error) { n++ })
		if err == nil || n == 0 {
			t.Fatalf("OpenWait on a closed port = %v after %d reported attempts, want an error after at least one", err, n)
		}
	})
}

// TestOpenReady: the readiness check OpenReady sets fails with the object
// store's answer while it waits for it, and passes once the storage is
// open.
func TestOpenReady(t *testing.T) {
	t.Run("waiting", func(t *testing.T) {
		closed := httptest.NewServer(http.NotFoundHandler())
		closed.Close() // nothing listens any more
		o := storage.Options{Backend: "s3", S3: storage.S3Options{Endpoint: strings.TrimPrefix(closed.URL, "http://"), Bucket: "artifacts",
			AccessKey: "k", SecretKey: "s", Insecure: true}}
		ctx, cancel := context.WithTimeout(context.Background(), 2500*time.Millisecond)
		defer cancel()
		var ready telemetry.Checks
		if _, err := o.OpenReady(ctx, logr.Discard(), &ready); err == nil {
			t.Fatal("OpenReady on a closed port succeeded")
		}
		if err := ready.Err(); err == nil || !strings.Contains(err.Error(), "waiting for the object store") {
			t.Errorf("ready = %v, want it waiting for the object store", err)
		}
	})
	t.Run("open", func(t *testing.T) {
		o := storage.Options{Backend: "dir", Path: t.TempDir()}
		var ready telemetry.Checks
		ready.Set(storage.ReadyName, func() error { return errors.New("not opened yet") })
		s, err := o.OpenReady(context.Background(), logr.Discard(), &ready)
		if err != nil {
			t.Fatalf("OpenReady: %v", err)
		}
		defer storage.Close(s)
		if err := ready.Err(); err != nil {
			t.Errorf("ready = %v, want ready once open", err)
		}
	})
}
