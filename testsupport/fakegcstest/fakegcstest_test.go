package fakegcstest

import (
	"net"
	"testing"
)

func TestNew(t *testing.T) {
	s := New(t)
	s.MakeBucket(t, "testbucket")
	etag := s.Put(t, "testbucket", "dir/TESTFILE.md", "11111")
	if etag == "" {
		t.Fatal("empty ETag")
	}
	if got := s.Get(t, "testbucket", "dir/TESTFILE.md"); got != "11111" {
		t.Fatalf("object = %q, want 11111", got)
	}
	if again := s.Put(t, "testbucket", "dir/TESTFILE.md", "22222"); again == etag {
		t.Fatalf("overwriting the object kept its ETag %s", etag)
	}
	s.Delete(t, "testbucket", "dir/TESTFILE.md")
	if err := s.Stop(); err != nil {
		t.Fatal(err)
	}
	if conn, err := net.Dial("tcp", s.Endpoint); err == nil {
		conn.Close()
		t.Fatalf("%s still accepts connections after Stop", s.Endpoint)
	}
}
