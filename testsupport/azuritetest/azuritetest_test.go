package azuritetest

import (
	"context"
	"io"
	"net"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/storage/azblob"
)

func TestNew(t *testing.T) {
	s := New(t)
	s.MakeContainer(t, "testbucket")
	etag := s.Put(t, "testbucket", "dir/TESTFILE.md", "11111")
	if !strings.HasPrefix(etag, `"`) {
		t.Errorf("ETag %s is not quoted", etag)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	resp, err := s.Client.DownloadStream(ctx, "testbucket", "dir/TESTFILE.md", nil)
	if err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil || string(got) != "11111" {
		t.Fatalf("blob = %q, %v; want 11111", got, err)
	}
	page, err := s.Client.NewListBlobsFlatPager("testbucket", nil).NextPage(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if n := len(page.Segment.BlobItems); n != 1 {
		t.Fatalf("listed %d blobs", n)
	}
	t.Logf("ETag: upload %s, download %s, listing %s", etag, *resp.ETag, *page.Segment.BlobItems[0].Properties.ETag)

	// Another key is refused.
	cred, err := azblob.NewSharedKeyCredential(s.Account, "bm90LXRoZS1rZXk=")
	if err != nil {
		t.Fatal(err)
	}
	wrong, err := azblob.NewClientWithSharedKeyCredential(s.Endpoint, cred, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := wrong.NewListBlobsFlatPager("testbucket", nil).NextPage(ctx); err == nil {
		t.Error("a wrong account key was accepted")
	}

	if err := s.Stop(); err != nil {
		t.Fatal(err)
	}
	u, _ := url.Parse(s.Endpoint)
	if conn, err := net.Dial("tcp", u.Host); err == nil {
		conn.Close()
		t.Fatalf("%s still accepts connections after Stop", u.Host)
	}
}
