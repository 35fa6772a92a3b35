package e2e

import (
	"fmt"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"
)

// Retention of the package's Env: the packager's defaults, Flux's
// --artifact-retention-records and --artifact-retention-ttl.
const (
	retentionRecords = 2
	retentionTTL     = time.Minute
)

// TestRetention stores four artifacts of one source in quick succession
// (the first commit, then three new commits, each with a reconcile
// request). The packager keeps the newest two and, unlike Flux, never
// deletes an older one younger than the TTL: all four stay in the source's
// storage directory, and latest.tar.gz is the newest. Garbage collection
// runs after the status is written, so the directory is watched for a
// while.
func TestRetention(t *testing.T) {
	requireEnv(t)
	t.Parallel()
	const name = "retention"
	repo, c := newRepo(t, name, map[string]string{"CHANGELOG.md": "# Changes\n"})
	createSource(t, name, env.Git.RepoURL(name), branch)
	dir := filepath.Join(env.StoragePath, "gitrepository", namespace, name)
	// storedAt is when each artifact was written, as storage says.
	storedAt := func(c string) time.Time {
		fi, err := os.Stat(filepath.Join(dir, c+".tar.gz"))
		if err != nil {
			t.Fatalf("the artifact of %s just stored: %v", c, err)
		}
		return fi.ModTime()
	}
	obj := waitArtifact(t, name, revision(c))
	commits, times := []string{c}, []time.Time{storedAt(c)}
	for i := range 3 {
		c := commit(t, repo, map[string]string{"CHANGELOG.md": fmt.Sprintf("# Changes\n\n%d\n", i+1)}, fmt.Sprintf("Change %d", i+1))
		requestReconcile(t, name)
		obj = waitArtifact(t, name, revision(c))
		commits, times = append(commits, c), append(times, storedAt(c))
	}
	newest := commits[len(commits)-1]
	newestFile := newest + ".tar.gz"
	checkStored(t, obj, newest)

	// Which artifacts must be there: the newest records, and every older
	// one younger than the TTL when the newest was stored (a machine
	// slower than the TTL would see those collected).
	want := []string{"latest.tar.gz"}
	for i, c := range commits {
		if i < len(commits)-retentionRecords && times[len(times)-1].Sub(times[i]) >= retentionTTL {
			continue
		}
		want = append(want, c+".tar.gz")
	}
	slices.Sort(want)
	if len(want) != len(commits)+1 {
		t.Logf("storing the artifacts took longer than the TTL (%s): expecting only %v", retentionTTL, want)
	}

	check := func() error {
		got := retentionListing(t, dir)
		if !slices.Equal(got, want) {
			return fmt.Errorf("%s holds %v, want %v", dir, got, want)
		}
		if target, err := os.Readlink(filepath.Join(dir, "latest.tar.gz")); err == nil && target != newestFile {
			return fmt.Errorf("latest.tar.gz points at %s, want %s", target, newestFile)
		}
		b, err := os.ReadFile(filepath.Join(dir, "latest.tar.gz"))
		if err != nil {
			return err
		}
		if got := sha256Digest(b); got != obj.Status.Artifact.Digest {
			return fmt.Errorf("latest.tar.gz has digest %s, want the newest artifact's %s", got, obj.Status.Artifact.Digest)
		}
		return nil
	}
	eventually(t, "the storage directory after four artifacts", check)
	consistently(t, "the storage directory after four artifacts", 3*time.Second, check)

	// Every kept artifact is still served.
	for _, f := range want {
		url := env.ArtifactURL(fmt.Sprintf("gitrepository/%s/%s/%s", namespace, name, f))
		if status, _ := httpGet(t, url); status != http.StatusOK {
			t.Errorf("GET %s: %d, want 200", url, status)
		}
	}
	if a := get(t, name).Status.Artifact; a == nil || a.Revision != revision(newest) {
		t.Errorf("artifact %+v, want revision %s", a, revision(newest))
	}
	t.Cleanup(func() { requireServicesRunning(t) })
}

// retentionListing lists the files (and the latest link) in a source's
// storage directory, without subdirectories.
func retentionListing(t *testing.T, dir string) []string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		if e.Type()&fs.ModeDir != 0 {
			continue
		}
		names = append(names, e.Name())
	}
	slices.Sort(names)
	return names
}
