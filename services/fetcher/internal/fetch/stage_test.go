package fetch

import (
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	sourcev1 "github.com/fluxcd/source-controller/api/v1"

	"github.com/headwater-gitops/headwater/pkg/failure"
	"github.com/headwater-gitops/headwater/pkg/storage"
	"github.com/headwater-gitops/headwater/services/fetcher/internal/source"
)

// TestStageFileTooLarge checks that a file over -max-file-size fails the
// fetch for good (no retry would change it) with a message that names the
// file and the limit, not the temporary directory it was fetched into.
func TestStageFileTooLarge(t *testing.T) {
	store, err := storage.NewDir(t.TempDir())
	must(t, err)
	root := t.TempDir()
	must(t, os.MkdirAll(filepath.Join(root, "deploy"), 0o755))
	must(t, os.WriteFile(filepath.Join(root, "deploy", "small.yaml"), []byte("0123456789"), 0o644))
	must(t, os.WriteFile(filepath.Join(root, "deploy", "big.bin"), []byte("0123456789a"), 0o644))

	cases := []struct {
		name    string
		limit   int64
		wantErr string
	}{
		{name: "no limit", limit: 0},
		{name: "at the limit", limit: 11},
		{name: "over the limit", limit: 10,
			wantErr: "unable to archive artifact to storage: file too large: deploy/big.bin is 11 bytes, over the limit of 10"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h := &Handler{Storage: store, MaxFileSize: tc.limit}
			key := storage.StagingKey("job-" + strings.ReplaceAll(tc.name, " ", "-"))
			size, err := h.stage(context.Background(), key, &source.Content{Root: root})
			if tc.wantErr == "" {
				if err != nil || size == 0 {
					t.Fatalf("stage = %d, %v; want the tar staged", size, err)
				}
				return
			}
			var ferr *failure.Error
			if !errors.As(err, &ferr) {
				t.Fatalf("stage error = %v (%T), want a *failure.Error", err, err)
			}
			f := ferr.Data()
			if f.Condition != sourcev1.StorageOperationFailedCondition || f.Reason != sourcev1.ArchiveOperationFailedReason ||
				f.Stalled || ferr.Handling != failure.Final {
				t.Errorf("failure = %+v, handling %v; want StorageOperationFailed/ArchiveOperationFailed, final, not stalled", f, ferr.Handling)
			}
			if f.Message != tc.wantErr {
				t.Errorf("message = %q, want %q", f.Message, tc.wantErr)
			}
			if strings.Contains(f.Message, root) {
				t.Errorf("message %q names the temporary directory", f.Message)
			}
		})
	}
}

// TestStageFileAsIs checks that content that is the artifact itself is
// staged byte for byte, and that a file that cannot be read fails the
// fetch with StorageOperationFailed.
func TestStageFileAsIs(t *testing.T) {
	store, err := storage.NewDir(t.TempDir())
	must(t, err)
	h := &Handler{Storage: store}
	file := filepath.Join(t.TempDir(), "index.yaml")
	body := "apiVersion: v1\nentries: {}\n"
	must(t, os.WriteFile(file, []byte(body), 0o644))
	key := storage.StagingKey("job-file")
	size, err := h.stage(context.Background(), key, &source.Content{File: file, Root: "/does/not/matter"})
	if err != nil || size != int64(len(body)) {
		t.Fatalf("stage = %d, %v; want %d bytes staged", size, err, len(body))
	}
	obj, err := store.Open(context.Background(), key)
	must(t, err)
	defer obj.Close()
	got, err := io.ReadAll(obj)
	must(t, err)
	if string(got) != body {
		t.Errorf("staged %q, want the file unchanged %q", got, body)
	}

	_, err = h.stage(context.Background(), storage.StagingKey("job-gone"), &source.Content{File: filepath.Join(t.TempDir(), "gone")})
	if f := failure.As(err); f == nil || f.Condition != sourcev1.StorageOperationFailedCondition {
		t.Errorf("staging a missing file: %v, want a StorageOperationFailed failure", err)
	}
}
