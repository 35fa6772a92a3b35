package bucketfetch

import (
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/storage/azblob"
	"github.com/Azure/azure-sdk-for-go/sdk/storage/azblob/sas"
	"github.com/fluxcd/pkg/apis/meta"
	sourcev1 "github.com/fluxcd/source-controller/api/v1"

	"github.com/headwater-gitops/headwater/pkg/failure"
	"github.com/headwater-gitops/headwater/services/fetcher/internal/source"
	"github.com/headwater-gitops/headwater/services/fetcher/internal/source/sourcetest"
	"github.com/headwater-gitops/headwater/testsupport/azuritetest"
	"github.com/headwater-gitops/headwater/testsupport/fakegcstest"
)

// fluxRevision is Flux's revision of a bucket, written out again here so
// that the tests do not take the package's word for it: the SHA-256 of
// "<key> <etag>\n" per object, keys in byte order (Flux's index.Digester
// over the ETags it recorded: for Google Cloud Storage the object's etag
// attribute, for Azure the ETag header of the download).
func fluxRevision(etags map[string]string) string {
	keys := slices.Sorted(func(yield func(string) bool) {
		for k := range etags {
			if !yield(k) {
				return
			}
		}
	})
	var b strings.Builder
	for _, k := range keys {
		b.WriteString(k + " " + etags[k] + "\n")
	}
	sum := sha256.Sum256([]byte(b.String()))
	return "sha256:" + hex.EncodeToString(sum[:])
}

// emulator is one provider's emulator, as the walkthrough uses it.
type emulator struct {
	provider string
	// endpoint is spec.endpoint for a server at host:port.
	endpoint func(hostPort string) string
	hostPort string
	// secret is the Secret data that reads the bucket.
	secret   map[string]string
	insecure bool
	make     func(t *testing.T, bucket string)
	// put stores an object and returns the ETag Flux records for it.
	put    func(t *testing.T, bucket, key, content string) string
	remove func(t *testing.T, bucket, key string)
	// isList tells the requests that list the bucket's objects.
	isList func(r *http.Request) bool
}

func gcsEmulator(t *testing.T) *emulator {
	srv := fakegcstest.New(t)
	// fake-gcs-server takes any token: the key only has to be one the
	// token endpoint takes.
	tokens := tokenServer(t, true)
	return &emulator{
		provider: sourcev1.BucketProviderGoogle,
		endpoint: func(hp string) string { return hp },
		hostPort: srv.Endpoint,
		secret:   map[string]string{"serviceaccount": serviceAccountKey(t, "service_account", tokens.URL)},
		insecure: true,
		make:     func(t *testing.T, b string) { srv.MakeBucket(t, b) },
		put:      func(t *testing.T, b, k, c string) string { return srv.Put(t, b, k, c) },
		remove:   func(t *testing.T, b, k string) { srv.Delete(t, b, k) },
		isList: func(r *http.Request) bool {
			return r.Method == http.MethodGet && strings.HasSuffix(r.URL.Path, "/o")
		},
	}
}

func azureEmulator(t *testing.T) *emulator {
	srv := azuritetest.New(t)
	u, err := url.Parse(srv.Endpoint)
	must(t, err)
	return &emulator{
		provider: sourcev1.BucketProviderAzure,
		endpoint: func(hp string) string { return "http://" + hp + u.Path },
		hostPort: u.Host,
		secret:   map[string]string{"accountKey": srv.AccountKey},
		make:     func(t *testing.T, b string) { srv.MakeContainer(t, b) },
		put:      func(t *testing.T, b, k, c string) string { return srv.Put(t, b, k, c) },
		remove: func(t *testing.T, b, k string) {
			_, err := srv.Client.DeleteBlob(context.Background(), b, k, nil)
			must(t, err)
		},
		isList: func(r *http.Request) bool { return r.URL.Query().Get("comp") == "list" },
	}
}

// spec is a Bucket spec for the emulator at hostPort (itself or a proxy).
func (e *emulator) spec(hostPort, bucket string) sourcev1.BucketSpec {
	return sourcev1.BucketSpec{Provider: e.provider, BucketName: bucket, Endpoint: e.endpoint(hostPort),
		Insecure: e.insecure, SecretRef: &meta.LocalObjectReference{Name: "creds"}}
}

// providers runs a test against each emulator.
func providers(t *testing.T, test func(t *testing.T, e *emulator)) {
	for name, start := range map[string]func(*testing.T) *emulator{"gcp": gcsEmulator, "azure": azureEmulator} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			test(t, start(t))
		})
	}
}

func TestProviderFetch(t *testing.T) {
	providers(t, func(t *testing.T, e *emulator) {
		e.make(t, "podinfo")
		etags := map[string]string{}
		for k, v := range map[string]string{"TESTFILE.md": "11111", "deploy/app.yaml": "kind: ConfigMap\n", "deploy/logo.png": "png",
			".github/ci.yaml": "on: push\n", "prefix/a.yaml": "a", "prefix/sub/b.yaml": "bkt", "prefixed-sibling.md": "s"} {
			etags[k] = e.put(t, "podinfo", k, v)
		}
		e.put(t, "podinfo", "empty-dir/", "") // a directory marker, never a file
		e.make(t, "rules")
		rules := "*.png\n/deploy/skip.yaml\n"
		ruleEtags := map[string]string{}
		for k, v := range map[string]string{"deploy/app.yaml": "kind: ConfigMap\n", "deploy/skip.yaml": "skip", "deploy/logo.png": "png"} {
			ruleEtags[k] = e.put(t, "rules", k, v)
		}
		e.put(t, "rules", ".sourceignore", rules)
		pick := func(from map[string]string, keys ...string) map[string]string {
			m := map[string]string{}
			for _, k := range keys {
				m[k] = from[k]
			}
			return m
		}
		// Listings of two objects a page: every listing takes several.
		src := &Source{Secrets: kube(t, map[string]map[string]string{"creds": e.secret}), listPageSize: 2}
		cases := []struct {
			name, bucket, prefix string
			ignore               *string
			etags                map[string]string
			files                map[string]string
		}{
			{name: "whole bucket", bucket: "podinfo", etags: etags,
				files: map[string]string{"TESTFILE.md": "11111", "deploy/app.yaml": "kind: ConfigMap\n", "deploy/logo.png": "png",
					".github/ci.yaml": "on: push\n", "prefix/a.yaml": "a", "prefix/sub/b.yaml": "bkt", "prefixed-sibling.md": "s"}},
			{name: "prefix", bucket: "podinfo", prefix: "prefix/", etags: pick(etags, "prefix/a.yaml", "prefix/sub/b.yaml"),
				files: map[string]string{"prefix/a.yaml": "a", "prefix/sub/b.yaml": "bkt"}},
			{name: "spec.ignore", bucket: "podinfo", ignore: new(string("*.png\n/prefix*\n.github/\n")),
				etags: pick(etags, "TESTFILE.md", "deploy/app.yaml"),
				files: map[string]string{"TESTFILE.md": "11111", "deploy/app.yaml": "kind: ConfigMap\n"}},
			{name: ".sourceignore", bucket: "rules", etags: pick(ruleEtags, "deploy/app.yaml"),
				files: map[string]string{"deploy/app.yaml": "kind: ConfigMap\n", ".sourceignore": rules}},
			{name: ".sourceignore at the root applies under a prefix", bucket: "rules", prefix: "deploy/",
				etags: pick(ruleEtags, "deploy/app.yaml"),
				files: map[string]string{"deploy/app.yaml": "kind: ConfigMap\n", ".sourceignore": rules}},
			{name: "spec.ignore after .sourceignore", bucket: "rules", ignore: new(string("!*.png\n")),
				etags: pick(ruleEtags, "deploy/app.yaml", "deploy/logo.png"),
				files: map[string]string{"deploy/app.yaml": "kind: ConfigMap\n", "deploy/logo.png": "png", ".sourceignore": rules}},
		}
		for _, tc := range cases {
			t.Run(tc.name, func(t *testing.T) {
				spec := e.spec(e.hostPort, tc.bucket)
				spec.Prefix, spec.Ignore = tc.prefix, tc.ignore
				want := fluxRevision(tc.etags)
				// The listing alone gives Flux's revision: an unchanged
				// bucket is known without downloading it.
				res, err := src.Resolve(context.Background(), request(spec))
				must(t, err)
				if listed := res.Revision(); listed != want {
					t.Errorf("listing's revision %s, want %s", listed, want)
				}
				rev, content, got, err := sourcetest.Fetch(t, src, request(spec))
				must(t, err)
				wantContent := &source.Content{Root: content.Root, Revision: want, ArtifactName: strings.TrimPrefix(want, "sha256:") + ".tar.gz",
					EventMessage: "stored artifact with " + strconv.Itoa(len(tc.etags)) + " fetched files from '" + tc.bucket + "' bucket"}
				if rev != want || !reflect.DeepEqual(content, wantContent) {
					t.Errorf("resolved %s, content %+v\nwant %+v", rev, content, wantContent)
				}
				if !reflect.DeepEqual(got, tc.files) {
					t.Errorf("files = %v\nwant    %v", got, tc.files)
				}
			})
		}
	})
}

func TestProviderRevisionFollowsTheBucket(t *testing.T) {
	providers(t, func(t *testing.T, e *emulator) {
		e.make(t, "testbucket")
		e.put(t, "testbucket", "TESTFILE.md", "11111")
		e.put(t, "testbucket", "other.md", "other")
		src := &Source{Secrets: kube(t, map[string]map[string]string{"creds": e.secret})}
		req := request(e.spec(e.hostPort, "testbucket"))
		resolve := func() string {
			t.Helper()
			res, err := src.Resolve(context.Background(), req)
			must(t, err)
			return res.Revision()
		}
		first := resolve()
		if again := resolve(); again != first {
			t.Errorf("revision changed with the bucket unchanged: %s, then %s", first, again)
		}
		e.put(t, "testbucket", "TESTFILE.md", "22222")
		if changed := resolve(); changed == first {
			t.Errorf("revision %s did not change when an object changed", first)
		}
		e.remove(t, "testbucket", "TESTFILE.md")
		if removed := resolve(); removed == first {
			t.Errorf("revision %s did not change when an object was removed", first)
		}
	})
}

func TestProviderDownloadFollowsChangesAfterListing(t *testing.T) {
	providers(t, func(t *testing.T, e *emulator) {
		e.make(t, "bkt")
		kept := e.put(t, "bkt", "kept.md", "kept")
		e.put(t, "bkt", "changed.md", "before")
		e.put(t, "bkt", "deleted.md", "deleted")
		src := &Source{Secrets: kube(t, map[string]map[string]string{"creds": e.secret})}
		res, err := src.Resolve(context.Background(), request(e.spec(e.hostPort, "bkt")))
		must(t, err)
		after := map[string]string{"kept.md": kept, "changed.md": e.put(t, "bkt", "changed.md", "after")}
		e.remove(t, "bkt", "deleted.md")
		dir := t.TempDir()
		content, err := res.Download(context.Background(), dir)
		must(t, err)
		if want := fluxRevision(after); content.Revision != want {
			t.Errorf("content revision = %s, want %s", content.Revision, want)
		}
		if want := map[string]string{"kept.md": "kept", "changed.md": "after"}; !reflect.DeepEqual(sourcetest.Files(t, dir, nil), want) {
			t.Errorf("files = %v, want %v", sourcetest.Files(t, dir, nil), want)
		}
	})
}

// dropper is a proxy in front of an emulator that drops the connection of
// the requests drop picks, and records the Authorization headers it sees.
type dropper struct {
	srv  *httptest.Server
	drop atomic.Pointer[func(*http.Request) bool]

	mu    sync.Mutex
	auths []string
}

func newDropper(t *testing.T, target string) *dropper {
	d := &dropper{}
	u := &url.URL{Scheme: "http", Host: target}
	// The server sees its own host, as a client of it would send.
	proxy := &httputil.ReverseProxy{Rewrite: func(r *httputil.ProxyRequest) { r.SetURL(u) },
		ErrorLog: log.New(io.Discard, "", 0)}
	d.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		d.mu.Lock()
		d.auths = append(d.auths, r.Header.Get("Authorization"))
		d.mu.Unlock()
		if f := d.drop.Load(); f != nil && (*f)(r) {
			conn, _, err := http.NewResponseController(w).Hijack()
			if err == nil {
				// Half an answer, then the connection is gone.
				_, _ = conn.Write([]byte("HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n<?xml"))
				_ = conn.Close()
			}
			return
		}
		proxy.ServeHTTP(w, r)
	}))
	t.Cleanup(d.srv.Close)
	return d
}

func (d *dropper) hostPort() string { return strings.TrimPrefix(d.srv.URL, "http://") }

func TestProviderConnectionDroppedMidList(t *testing.T) {
	providers(t, func(t *testing.T, e *emulator) {
		e.make(t, "bkt")
		want := map[string]string{}
		for i := range 5 {
			k := "obj-" + strconv.Itoa(i) + ".yaml"
			want[k] = e.put(t, "bkt", k, "content "+strconv.Itoa(i))
		}
		proxy := newDropper(t, e.hostPort)
		src := &Source{Secrets: kube(t, map[string]map[string]string{"creds": e.secret}), listPageSize: 2, MaxRetries: 1}
		req := request(e.spec(proxy.hostPort(), "bkt"))

		// The second page of the listing is cut off.
		var lists atomic.Int32
		drop := func(r *http.Request) bool { return e.isList(r) && lists.Add(1) == 3 }
		proxy.drop.Store(&drop)
		_, err := src.Resolve(context.Background(), req)
		sourcetest.CheckFailure(t, err, sourcev1.BucketOperationFailedReason, failure.Transient,
			"indexation of objects from bucket 'bkt' failed: listing objects from bucket 'bkt' failed: ")
		if n := lists.Load(); n != 3 {
			t.Errorf("%d list requests, want the existence check and two pages (3)", n)
		}

		// Nothing is lost: the next attempt lists and fetches everything.
		proxy.drop.Store(nil)
		rev, _, files, err := sourcetest.Fetch(t, src, req)
		must(t, err)
		if rev != fluxRevision(want) || len(files) != 5 {
			t.Errorf("after the drop: revision %s, want %s; files %v", rev, fluxRevision(want), files)
		}

		// A download cut off fails the job, transiently, and leaves no file.
		res, err := src.Resolve(context.Background(), req)
		must(t, err)
		get := func(r *http.Request) bool {
			return r.Method == http.MethodGet && !e.isList(r) && strings.Contains(r.URL.Path, "obj-3")
		}
		proxy.drop.Store(&get)
		dir := t.TempDir()
		_, err = res.Download(context.Background(), dir)
		sourcetest.CheckFailure(t, err, sourcev1.BucketOperationFailedReason, failure.Transient, "fetch from bucket 'bkt' failed: ")
	})
}

func TestProviderRefusedCredentials(t *testing.T) {
	t.Run("gcp", func(t *testing.T) {
		t.Parallel()
		srv := fakegcstest.New(t)
		srv.MakeBucket(t, "testbucket")
		srv.Put(t, "testbucket", "TESTFILE.md", "11111")
		refusing := tokenServer(t, false)
		accepting := tokenServer(t, true)
		src := &Source{
			Secrets: kube(t, map[string]map[string]string{
				"refused":  {"serviceaccount": serviceAccountKey(t, "service_account", refusing.URL)},
				"good":     {"serviceaccount": serviceAccountKey(t, "service_account", accepting.URL)},
				"external": {"serviceaccount": `{"type":"external_account","credential_source":{"file":"/var/run/secrets/token"}}`},
				"notjson":  {"serviceaccount": "not-json-secret-material"},
				"other":    {"accesskey": "a", "secretkey": "b"},
			}),
			MaxRetries: 1,
		}
		proxy := newDropper(t, srv.Endpoint)
		cases := []struct {
			name, secret, endpoint, bucket string
			reason                         string
			handling                       failure.Handling
			message                        string
		}{
			{name: "token endpoint refuses the key", secret: "refused", reason: sourcev1.BucketOperationFailedReason, handling: failure.Final,
				message: "failed to confirm existence of 'testbucket' bucket: "},
			{name: "external account", secret: "external", reason: sourcev1.AuthenticationFailedReason, handling: failure.Stalling,
				message: "failed to create Google credentials from secret: invalid 'external' secret data: 'serviceaccount' is not a service account key: type 'external_account', want 'service_account'"},
			{name: "not JSON", secret: "notjson", reason: sourcev1.AuthenticationFailedReason, handling: failure.Stalling,
				message: "invalid 'notjson' secret data: 'serviceaccount' is not JSON (syntax error at byte 2)"},
			{name: "no serviceaccount key", secret: "other", reason: sourcev1.AuthenticationFailedReason, handling: failure.Stalling,
				message: "invalid 'other' secret data: required fields 'serviceaccount'"},
			{name: "missing bucket", secret: "good", bucket: "nope", reason: sourcev1.BucketOperationFailedReason, handling: failure.Transient,
				message: "bucket 'nope' not found"},
			{name: "bucket name", secret: "good", bucket: "Not_A_Bucket!", reason: sourcev1.BucketOperationFailedReason, handling: failure.Stalling,
				message: "invalid bucket name 'Not_A_Bucket!': "},
			{name: "endpoint with a path", secret: "good", endpoint: srv.Endpoint + "/storage", reason: sourcev1.URLInvalidReason, handling: failure.Stalling,
				message: "invalid endpoint '" + srv.Endpoint + "/storage': want host[:port] or an http(s) URL without path, query or user-info"},
		}
		for _, tc := range cases {
			t.Run(tc.name, func(t *testing.T) {
				spec := sourcev1.BucketSpec{Provider: sourcev1.BucketProviderGoogle, BucketName: tc.bucket, Endpoint: tc.endpoint, Insecure: true,
					SecretRef: &meta.LocalObjectReference{Name: tc.secret}}
				if spec.BucketName == "" {
					spec.BucketName = "testbucket"
				}
				if spec.Endpoint == "" {
					spec.Endpoint = proxy.hostPort()
				}
				_, err := src.Resolve(context.Background(), request(spec))
				sourcetest.CheckFailure(t, err, tc.reason, tc.handling, tc.message)
				for _, secret := range []string{"PRIVATE KEY", "not-json-secret-material", "/var/run/secrets/token"} {
					if strings.Contains(err.Error(), secret) {
						t.Errorf("message reveals the Secret (%s): %s", secret, err)
					}
				}
			})
		}
		// The key that the token endpoint takes is used: its token reaches
		// the server.
		proxy.mu.Lock()
		proxy.auths = nil
		proxy.mu.Unlock()
		_, _, files, err := sourcetest.Fetch(t, src, request(sourcev1.BucketSpec{Provider: sourcev1.BucketProviderGoogle, BucketName: "testbucket",
			Endpoint: proxy.hostPort(), Insecure: true, SecretRef: &meta.LocalObjectReference{Name: "good"}}))
		must(t, err)
		if want := map[string]string{"TESTFILE.md": "11111"}; !reflect.DeepEqual(files, want) {
			t.Errorf("files = %v, want %v", files, want)
		}
		proxy.mu.Lock()
		defer proxy.mu.Unlock()
		if len(proxy.auths) == 0 || slices.ContainsFunc(proxy.auths, func(a string) bool { return a != "Bearer test-token" }) {
			t.Errorf("Authorization headers %v, want the token endpoint's on every request", proxy.auths)
		}
	})

	t.Run("azure", func(t *testing.T) {
		t.Parallel()
		srv := azuritetest.New(t)
		srv.MakeContainer(t, "testbucket")
		srv.Put(t, "testbucket", "TESTFILE.md", "11111")
		cred, err := sasCredential(srv)
		must(t, err)
		containerSAS, err := sas.BlobSignatureValues{Protocol: sas.ProtocolHTTPSandHTTP, ExpiryTime: time.Now().Add(time.Hour),
			ContainerName: "testbucket", Permissions: (&sas.ContainerPermissions{Read: true, List: true}).String()}.SignWithSharedKey(cred)
		must(t, err)
		src := &Source{
			Secrets: kube(t, map[string]map[string]string{
				"good":    {"accountKey": srv.AccountKey},
				"wrong":   {"accountKey": "bm90LXRoZS1hY2NvdW50LWtleQ=="},
				"sas":     {"sasKey": "?" + containerSAS.Encode()},
				"badsas":  {"sasKey": "sig=%zz-secret-token"},
				"notb64":  {"accountKey": "!!not-base64-secret!!"},
				"nothing": {"region": "x"},
				"partial": {"tenantId": "t", "clientSecret": "s"},
			}),
			MaxRetries: 1,
		}
		cases := []struct {
			name, secret, endpoint, bucket string
			reason                         string
			handling                       failure.Handling
			message                        string
		}{
			{name: "wrong account key", secret: "wrong", reason: sourcev1.BucketOperationFailedReason, handling: failure.Final,
				message: "failed to confirm existence of 'testbucket' bucket: "},
			{name: "key not base64", secret: "notb64", reason: sourcev1.AuthenticationFailedReason, handling: failure.Stalling,
				message: "failed to create shared credential from 'notb64' Secret data: 'accountKey' is not base64"},
			{name: "SAS token not a query", secret: "badsas", reason: sourcev1.AuthenticationFailedReason, handling: failure.Stalling,
				message: "unable to parse SAS token: 'sasKey' is not a URL query"},
			// Azure answers AuthenticationFailed (and Flux's words say what it
			// may mean), Azurite AuthorizationFailure: both are refusals.
			{name: "container SAS for another container", secret: "sas", bucket: "other", reason: sourcev1.BucketOperationFailedReason, handling: failure.Final,
				message: "failed to confirm existence of 'other' bucket: "},
			{name: "no credential in the Secret", secret: "nothing", reason: sourcev1.AuthenticationFailedReason, handling: failure.Stalling,
				message: "invalid 'nothing' secret data: requires a 'clientId' or 'accountKey' field, a combination of 'tenantId', 'clientId' and 'clientSecret', or 'tenantId', 'clientId' and 'clientCertificate'"},
			{name: "service principal without client ID", secret: "partial", reason: sourcev1.AuthenticationFailedReason, handling: failure.Stalling,
				message: "invalid 'partial' secret data: requires a 'clientId' or 'accountKey' field"},
			{name: "missing container", secret: "good", bucket: "nope", reason: sourcev1.BucketOperationFailedReason, handling: failure.Transient,
				message: "bucket 'nope' not found"},
			{name: "container name", secret: "good", bucket: "a--b", reason: sourcev1.BucketOperationFailedReason, handling: failure.Stalling,
				message: "invalid bucket name 'a--b': "},
			{name: "endpoint without scheme", secret: "good", endpoint: "account.blob.core.windows.net", reason: sourcev1.URLInvalidReason, handling: failure.Stalling,
				message: "invalid endpoint 'account.blob.core.windows.net': want the account's blob service URL"},
			{name: "account key with an endpoint naming no account", secret: "good", endpoint: "http://blob.local:1", reason: sourcev1.AuthenticationFailedReason, handling: failure.Stalling,
				message: "failed to create shared credential from 'good' Secret data: failed to extract account name from endpoint: expected 'blob.local' to be a subdomain"},
		}
		for _, tc := range cases {
			t.Run(tc.name, func(t *testing.T) {
				spec := sourcev1.BucketSpec{Provider: sourcev1.BucketProviderAzure, BucketName: tc.bucket, Endpoint: tc.endpoint,
					SecretRef: &meta.LocalObjectReference{Name: tc.secret}}
				if spec.BucketName == "" {
					spec.BucketName = "testbucket"
				}
				if spec.Endpoint == "" {
					spec.Endpoint = srv.Endpoint
				}
				_, err := src.Resolve(context.Background(), request(spec))
				sourcetest.CheckFailure(t, err, tc.reason, tc.handling, tc.message)
				for _, secret := range []string{srv.AccountKey, "bm90LXRoZS1hY2NvdW50LWtleQ", "secret-token", "not-base64-secret", containerSAS.Signature()} {
					if strings.Contains(err.Error(), secret) {
						t.Errorf("message reveals the Secret (%s): %s", secret, err)
					}
				}
			})
		}
		// A container SAS token reads the container.
		_, _, files, err := sourcetest.Fetch(t, src, request(sourcev1.BucketSpec{Provider: sourcev1.BucketProviderAzure, BucketName: "testbucket",
			Endpoint: srv.Endpoint, SecretRef: &meta.LocalObjectReference{Name: "sas"}}))
		must(t, err)
		if want := map[string]string{"TESTFILE.md": "11111"}; !reflect.DeepEqual(files, want) {
			t.Errorf("files with a SAS token = %v, want %v", files, want)
		}
	})
}

func TestGCSEndpoint(t *testing.T) {
	cases := []struct {
		endpoint string
		insecure bool
		want     string
	}{
		{endpoint: "storage.googleapis.com", want: ""},
		{endpoint: "https://storage.googleapis.com", want: ""},
		{endpoint: "storage.googleapis.com:443", want: ""},
		{endpoint: "127.0.0.1:4443", insecure: true, want: "http://127.0.0.1:4443/storage/v1/"},
		{endpoint: "gcs.example.com", want: "https://gcs.example.com/storage/v1/"},
		{endpoint: "http://gcs.example.com:8080/", want: "http://gcs.example.com:8080/storage/v1/"},
	}
	for _, tc := range cases {
		got, err := gcsEndpoint(&sourcev1.BucketSpec{Endpoint: tc.endpoint, Insecure: tc.insecure})
		if err != nil || got != tc.want {
			t.Errorf("gcsEndpoint(%q, insecure %v) = %q, %v; want %q", tc.endpoint, tc.insecure, got, err, tc.want)
		}
	}
	for _, bad := range []string{"ftp://gcs.example.com", "https://user:pw@gcs.example.com", "gcs.example.com/path", "https://gcs.example.com?x=1"} {
		_, err := gcsEndpoint(&sourcev1.BucketSpec{Endpoint: bad})
		if err == nil || strings.Contains(err.Error(), "pw@") {
			t.Errorf("gcsEndpoint(%q) = %v, want an error that shows no password", bad, err)
		}
	}
}

func TestAzureAccountName(t *testing.T) {
	cases := map[string]string{
		"https://myaccount.blob.core.windows.net":   "myaccount",
		"https://myaccount.blob.core.windows.net/":  "myaccount",
		"http://127.0.0.1:10000/devstoreaccount1":   "devstoreaccount1",
		"http://localhost:10000/devstoreaccount1/x": "devstoreaccount1",
	}
	for endpoint, want := range cases {
		u, err := url.Parse(endpoint)
		must(t, err)
		if got, err := azureAccountName(u); err != nil || got != want {
			t.Errorf("azureAccountName(%s) = %q, %v; want %q", endpoint, got, err, want)
		}
	}
	u, _ := url.Parse("http://127.0.0.1:10000")
	if _, err := azureAccountName(u); err == nil {
		t.Error("an IP endpoint without an account path was accepted")
	}
}

// tokenServer is an OAuth 2.0 token endpoint for service account keys: it
// issues "test-token" for any JWT assertion, or refuses every one as
// Google does a revoked key.
func tokenServer(t *testing.T, accept bool) *httptest.Server {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err := r.ParseForm(); err != nil || r.Form.Get("assertion") == "" {
			http.Error(w, `{"error":"invalid_request"}`, http.StatusBadRequest)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		if !accept {
			w.WriteHeader(http.StatusBadRequest)
			_, _ = w.Write([]byte(`{"error":"invalid_grant","error_description":"Invalid JWT Signature."}`))
			return
		}
		_, _ = w.Write([]byte(`{"access_token":"test-token","token_type":"Bearer","expires_in":3600}`))
	}))
	t.Cleanup(srv.Close)
	return srv
}

// serviceAccountKey is a service account key file of the given type with
// a fresh RSA key, whose tokens come from tokenURI.
func serviceAccountKey(t *testing.T, typ, tokenURI string) string {
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	must(t, err)
	der, err := x509.MarshalPKCS8PrivateKey(key)
	must(t, err)
	data, err := json.Marshal(map[string]string{
		"type": typ, "project_id": "test-project", "private_key_id": "k1",
		"private_key":  string(pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der})),
		"client_email": "reader@test-project.iam.gserviceaccount.com", "client_id": "1", "token_uri": tokenURI,
	})
	must(t, err)
	return string(data)
}

// sasCredential is the shared key of the emulator's account, to sign SAS
// tokens with.
func sasCredential(srv *azuritetest.Server) (*azblob.SharedKeyCredential, error) {
	return azblob.NewSharedKeyCredential(srv.Account, srv.AccountKey)
}

func TestGCSDefaultCredentials(t *testing.T) {
	srv := fakegcstest.New(t)
	srv.MakeBucket(t, "testbucket")
	srv.Put(t, "testbucket", "TESTFILE.md", "11111")
	proxy := newDropper(t, srv.Endpoint)
	req := request(sourcev1.BucketSpec{Provider: sourcev1.BucketProviderGoogle, BucketName: "testbucket", Endpoint: proxy.hostPort(), Insecure: true})
	// No gcloud configuration of the developer's is found.
	t.Setenv("HOME", t.TempDir())
	t.Setenv("CLOUDSDK_CONFIG", t.TempDir())
	auths := func() []string {
		proxy.mu.Lock()
		defer proxy.mu.Unlock()
		a := proxy.auths
		proxy.auths = nil
		return a
	}

	// The application default credentials: here a key file named by
	// GOOGLE_APPLICATION_CREDENTIALS (on GKE, the metadata server).
	keyFile := t.TempDir() + "/key.json"
	must(t, os.WriteFile(keyFile, []byte(serviceAccountKey(t, "service_account", tokenServer(t, true).URL)), 0o600))
	t.Setenv("GOOGLE_APPLICATION_CREDENTIALS", keyFile)
	_, _, files, err := sourcetest.Fetch(t, &Source{}, req)
	must(t, err)
	if got := auths(); len(files) != 1 || len(got) == 0 || slices.ContainsFunc(got, func(a string) bool { return a != "Bearer test-token" }) {
		t.Errorf("with default credentials: files %v, Authorization headers %v", files, got)
	}

	// None at all: an endpoint that is not Google's is read anonymously.
	t.Setenv("GOOGLE_APPLICATION_CREDENTIALS", "")
	_, _, files, err = sourcetest.Fetch(t, &Source{}, req)
	must(t, err)
	if got := auths(); len(files) != 1 || slices.ContainsFunc(got, func(a string) bool { return a != "" }) {
		t.Errorf("without credentials: files %v, Authorization headers %v", files, got)
	}
}

func TestBucketNames(t *testing.T) {
	for name, want := range map[string]bool{
		"abc": true, "my-bucket.v1_x": true, "ab": false, "-abc": false, "abc.": false, "ABC": false, "a/b/c": false,
		strings.Repeat("a", 222): true, strings.Repeat("a", 223): false,
	} {
		if got := validGCSBucketName(name); got != want {
			t.Errorf("validGCSBucketName(%q) = %v, want %v", name, got, want)
		}
	}
	for name, want := range map[string]bool{
		"abc": true, "my-container-1": true, "a--b": false, "my_container": false, "my.container": false, "-ab": false, "ab-": false,
		strings.Repeat("a", 63): true, strings.Repeat("a", 64): false,
	} {
		if got := validAzureContainerName(name); got != want {
			t.Errorf("validAzureContainerName(%q) = %v, want %v", name, got, want)
		}
	}
}
