// Package sourcetest holds what the tests of every source kind share:
// resolving and downloading a request as the fetch handler does, reading
// what was downloaded, and checking a failure; and, for the workload
// identity tests, a real API server with the ServiceAccounts a source logs
// in as, an environment for the clouds' SDKs, and the bearer check of the
// test fronts that take only the tokens a test token endpoint issued.
package sourcetest

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/headwater-gitops/headwater/pkg/events"
	"github.com/headwater-gitops/headwater/pkg/failure"
	"github.com/headwater-gitops/headwater/services/fetcher/internal/source"
)

// Fetch resolves and downloads req into a temporary directory and returns
// the revision resolved, the content and the files it keeps (see Files).
func Fetch(t *testing.T, src source.Source, req *events.FetchRequested) (string, *source.Content, map[string]string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	res, err := src.Resolve(ctx, req)
	if err != nil {
		return "", nil, nil, err
	}
	dir := t.TempDir()
	content, err := res.Download(ctx, dir)
	if err != nil {
		return res.Revision(), nil, nil, err
	}
	return res.Revision(), content, Files(t, dir, content.Exclude), nil
}

// Files lists the regular files under dir that exclude (nil: none) keeps,
// by slash-separated relative path, with their content.
func Files(t *testing.T, dir string, exclude func(rel string, isDir bool) bool) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return err
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil {
			return err
		}
		rel = filepath.ToSlash(rel)
		if exclude != nil && exclude(rel, false) {
			return nil
		}
		b, err := os.ReadFile(p)
		out[rel] = string(b)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// CheckFailure checks that err is a *failure.Error with reason, handling
// and a message containing message.
func CheckFailure(t *testing.T, err error, reason string, handling failure.Handling, message string) {
	t.Helper()
	var ferr *failure.Error
	if !errors.As(err, &ferr) {
		t.Fatalf("error = %v (%T), want a *failure.Error", err, err)
	}
	if ferr.Reason != reason || ferr.Handling != handling || !strings.Contains(ferr.Error(), message) {
		t.Errorf("failure = reason %q, handling %s, message %q\nwant reason %q, handling %s, message containing %q",
			ferr.Reason, ferr.Handling, ferr.Error(), reason, handling, message)
	}
}
