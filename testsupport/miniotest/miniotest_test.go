package miniotest

import (
	"bytes"
	"context"
	"io"
	"net"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/minio/minio-go/v7"
)

func TestNew(t *testing.T) {
	s := New(t)
	s.MakeBucket(t, "testbucket")

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	want := []byte("11111")
	if _, err := s.Client.PutObject(ctx, "testbucket", "TESTFILE.md", bytes.NewReader(want), int64(len(want)), minio.PutObjectOptions{}); err != nil {
		t.Fatal(err)
	}
	obj, err := s.Client.GetObject(ctx, "testbucket", "TESTFILE.md", minio.GetObjectOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer obj.Close()
	got, err := io.ReadAll(obj)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("object = %q, want %q", got, want)
	}
	if !strings.HasPrefix(s.Endpoint, "127.0.0.1:") || s.URL() != "http://"+s.Endpoint {
		t.Fatalf("endpoint %q, url %q: want 127.0.0.1 over http", s.Endpoint, s.URL())
	}
}

func TestCredentialsAreRequired(t *testing.T) {
	s := New(t)
	anonymous, err := minio.New(s.Endpoint, &minio.Options{})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := anonymous.ListBuckets(ctx); err == nil {
		t.Fatal("anonymous ListBuckets succeeded; want access denied")
	}
}

func TestStartAndStop(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "data")
	s, err := Start(dir)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := s.Client.MakeBucket(ctx, "kept", minio.MakeBucketOptions{}); err != nil {
		_ = s.Stop()
		t.Fatal(err)
	}
	if err := s.Stop(); err != nil {
		t.Fatal(err)
	}
	if err := s.Stop(); err != nil {
		t.Fatalf("second Stop: %v", err)
	}
	if conn, err := net.Dial("tcp", s.Endpoint); err == nil {
		conn.Close()
		t.Fatalf("%s still accepts connections after Stop", s.Endpoint)
	}

	// The data outlives the server: a new one on the same directory has it.
	s2, err := Start(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Stop()
	ok, err := s2.Client.BucketExists(ctx, "kept")
	if err != nil || !ok {
		t.Fatalf("bucket after restart: exists %v, err %v", ok, err)
	}
}

// fatalRecorder is a testing.TB whose Fatal ends only the calling goroutine
// and records the message.
type fatalRecorder struct {
	testing.TB
	msg string
}

func (f *fatalRecorder) Helper() {}

func (f *fatalRecorder) Fatal(args ...any) {
	for _, a := range args {
		if err, ok := a.(error); ok {
			f.msg += err.Error()
		}
	}
	runtime.Goexit()
}

func TestNewWithoutBinary(t *testing.T) {
	tests := []struct {
		name, bin string
	}{
		{name: "unset", bin: ""},
		{name: "missing", bin: filepath.Join(t.TempDir(), "no-minio")},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Setenv(BinEnv, tt.bin)
			rec := &fatalRecorder{TB: t}
			done := make(chan *Server)
			go func() {
				defer close(done)
				done <- New(rec)
			}()
			if s := <-done; s != nil {
				t.Fatal("New returned a server without a binary")
			}
			if !strings.Contains(rec.msg, "run `make minio` (it builds MinIO") {
				t.Fatalf("fatal message %q does not say how to get MinIO", rec.msg)
			}
			if _, err := Start(t.TempDir()); err == nil || !strings.Contains(err.Error(), "make minio") {
				t.Fatalf("Start without a binary: %v", err)
			}
		})
	}
}
