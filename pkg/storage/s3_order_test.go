package storage

import (
	"context"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/headwater-gitops/headwater/testsupport/miniotest"
)

// TestS3LateCopyIsRepaired plays, one step at a time, the interleaving
// TestLatestRace rarely meets on a local MinIO: an older job writes its
// order record, a newer job writes its own, copies and checks, and only
// then does the older job's copy land. The older job reads the record
// after its copy, finds the newer job's there, and copies that job's
// target back: the pointer ends at the newest job's artifact. Without the
// read after the copy, the older artifact stayed.
func TestS3LateCopyIsRepaired(t *testing.T) {
	srv := miniotest.New(t)
	srv.MakeBucket(t, "artifacts")
	s, err := NewS3(srv.Client, "artifacts", "")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	dir := SourceDir("GitRepository", "ns", "app")
	latest := dir + "/" + LatestName
	for _, rev := range []string{"older", "newer"} {
		if _, err := s.Put(ctx, dir+"/"+rev+".tar.gz", strings.NewReader(rev)); err != nil {
			t.Fatal(err)
		}
	}
	requested := time.Date(2026, 12, 4, 23, 0, 0, 0, time.UTC)
	older := orderRecord{RequestedAt: requested, Target: "older.tar.gz"}

	if err := s.claimOrder(ctx, latest, older); err != nil {
		t.Fatal(err)
	}
	if err := s.SetLatest(ctx, latest, dir+"/newer.tar.gz", requested.Add(time.Second)); err != nil {
		t.Fatal(err)
	}
	if err := s.copyInOrder(ctx, latest, older); err != nil {
		t.Fatal(err)
	}
	obj, err := s.Open(ctx, latest)
	if err != nil {
		t.Fatal(err)
	}
	defer obj.Close()
	b, err := io.ReadAll(obj)
	if err != nil {
		t.Fatal(err)
	}
	if string(b) != "newer" {
		t.Fatalf("latest holds %q after the older job's late copy, want the newer job's artifact", b)
	}
}
