package bucketfetch

import (
	"context"
	"crypto/tls"
	"encoding/pem"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/fluxcd/pkg/apis/meta"
	sourcev1 "github.com/fluxcd/source-controller/api/v1"

	"github.com/headwater-gitops/headwater/pkg/failure"
	"github.com/headwater-gitops/headwater/services/fetcher/internal/source/sourcetest"
	"github.com/headwater-gitops/headwater/testsupport/ldapserver"
	"github.com/headwater-gitops/headwater/testsupport/miniotest"
	"github.com/headwater-gitops/headwater/testsupport/miniotest/ldapminio"
	"github.com/headwater-gitops/headwater/testsupport/tokenserver"
)

// TestSTSLDAP reads a generic Bucket with spec.sts provider ldap, as Flux:
// the fetcher exchanges the LDAP username and password of
// spec.sts.secretRef at MinIO's STS endpoint (AssumeRoleWithLDAPIdentity)
// for temporary credentials, MinIO checks them against an LDAP directory
// (a real LDAP server), and the bucket is read with them. A wrong password
// fails with AuthenticationFailed and MinIO's reason, retried; the
// content identity differs from the same bucket read with other
// credentials.
func TestSTSLDAP(t *testing.T) {
	dir, err := ldapserver.Start(map[string]string{"alice": "wonderland"}, "lookup-secret")
	must(t, err)
	t.Cleanup(func() { _ = dir.Stop() })
	srv, plugin := ldapminio.New(t, dir)
	srv.MakeBucket(t, "ldapbucket")
	put(t, srv, "ldapbucket", "app/config.yaml", "replicas: 2\n")

	src := &Source{Secrets: kube(t, map[string]map[string]string{
		"ldap":       {"username": "alice", "password": "wonderland"},
		"ldap-wrong": {"username": "alice", "password": "looking-glass"},
	}), MaxRetries: 1}
	spec := func(secret string) sourcev1.BucketSpec {
		return sourcev1.BucketSpec{Provider: sourcev1.BucketProviderGeneric, BucketName: "ldapbucket", Endpoint: srv.Endpoint, Insecure: true,
			STS: &sourcev1.BucketSTSSpec{Provider: sourcev1.STSProviderLDAP, Endpoint: "http://" + srv.Endpoint,
				SecretRef: &meta.LocalObjectReference{Name: secret}}}
	}
	_, _, got, err := sourcetest.Fetch(t, src, request(spec("ldap")))
	must(t, err)
	if want := map[string]string{"app/config.yaml": "replicas: 2\n"}; !reflect.DeepEqual(got, want) {
		t.Errorf("files = %v, want %v", got, want)
	}
	alice := ldapserver.UserDN("alice")
	if n := dir.Binds(alice); n == 0 {
		t.Errorf("MinIO never bound to the directory as %s: the exchange did not reach LDAP", alice)
	}
	if n := plugin.RequestsAs(alice); n == 0 {
		t.Errorf("no request reached MinIO with the temporary credentials of %s", alice)
	}

	_, _, _, err = sourcetest.Fetch(t, src, request(spec("ldap-wrong")))
	sourcetest.CheckFailure(t, err, sourcev1.AuthenticationFailedReason, failure.Transient,
		"STS authentication failed: AssumeRoleWithLDAPIdentity at 'http://"+srv.Endpoint+"'")

	t.Run("certSecretRef", func(t *testing.T) {
		// The STS endpoint behind TLS with a certificate of its own
		// authority: trusted with spec.sts.certSecretRef's ca.crt only.
		target, err := url.Parse("http://" + srv.Endpoint)
		must(t, err)
		front := httptest.NewTLSServer(httputil.NewSingleHostReverseProxy(target))
		t.Cleanup(front.Close)
		caPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: front.Certificate().Raw})
		src := &Source{Secrets: kube(t, map[string]map[string]string{
			"ldap":    {"username": "alice", "password": "wonderland"},
			"sts-tls": {"ca.crt": string(caPEM)},
		}), MaxRetries: 1}
		s := spec("ldap")
		s.STS.Endpoint = front.URL
		_, _, _, err = sourcetest.Fetch(t, src, request(s))
		sourcetest.CheckFailure(t, err, sourcev1.AuthenticationFailedReason, failure.Transient, "STS authentication failed: ")
		if !strings.Contains(err.Error(), "certificate") {
			t.Errorf("without certSecretRef: %v, want a certificate error", err)
		}
		s.STS.CertSecretRef = &meta.LocalObjectReference{Name: "sts-tls"}
		before := dir.Binds(alice)
		_, _, got, err := sourcetest.Fetch(t, src, request(s))
		must(t, err)
		if len(got) != 1 || dir.Binds(alice) == before {
			t.Errorf("files %v, binds %d -> %d: want the bucket read after an exchange through TLS", got, before, dir.Binds(alice))
		}
	})
}

// TestSTSAWS reads an aws Bucket with spec.sts provider aws, as Flux: the
// fetcher's web identity (IRSA: AWS_ROLE_ARN and
// AWS_WEB_IDENTITY_TOKEN_FILE) is exchanged at spec.sts.endpoint, an AWS
// STS host name, for temporary credentials (AssumeRoleWithWebIdentity,
// answered by a test STS server that checks the role and the token and
// hands out real temporary credentials of MinIO), and the bucket is read
// with them. Another role is refused with STS's AccessDenied, a forged
// token with InvalidIdentityToken, an STS that answers 503 fails the
// fetch for a retry; all with AuthenticationFailed.
func TestSTSAWS(t *testing.T) {
	srv := miniotest.New(t)
	srv.MakeBucket(t, "awsbucket")
	put(t, srv, "awsbucket", "app/config.yaml", "replicas: 3\n")
	const role, token, host = "arn:aws:iam::123456789012:role/flux-source", "projected-service-account-token", "sts.us-east-1.amazonaws.com"
	sts := &tokenserver.AWSSTS{RoleARN: role, Token: token, Mint: func() (string, string, string, time.Time, error) {
		// MinIO's own STS makes the temporary credentials the bucket
		// accepts.
		v, err := srv.AssumeRole()
		return v.AccessKeyID, v.SecretAccessKey, v.SessionToken, v.Expiration, err
	}}
	srv.WaitIAM(t)
	must(t, sts.Start("127.0.0.1:0", host))
	t.Cleanup(func() { _ = sts.Stop() })
	tokenFile := filepath.Join(t.TempDir(), "token")
	must(t, os.WriteFile(tokenFile, []byte(token), 0o600))
	t.Setenv("AWS_ACCESS_KEY_ID", "")
	t.Setenv("AWS_SECRET_ACCESS_KEY", "")
	t.Setenv("AWS_SHARED_CREDENTIALS_FILE", filepath.Join(t.TempDir(), "none"))
	t.Setenv("AWS_REGION", "us-east-1")
	t.Setenv("AWS_WEB_IDENTITY_TOKEN_FILE", tokenFile)
	t.Setenv("AWS_ROLE_ARN", role)
	dialer := &net.Dialer{}
	src := &Source{MaxRetries: 1, stsRoundTripper: &http.Transport{
		// AWS's host name reaches the test STS server, whose certificate
		// is for that name.
		DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
			return dialer.DialContext(ctx, network, sts.Addr())
		},
		TLSClientConfig: &tls.Config{RootCAs: sts.CAPool(), MinVersion: tls.VersionTLS12},
	}}
	req := request(sourcev1.BucketSpec{Provider: sourcev1.BucketProviderAmazon, BucketName: "awsbucket", Endpoint: srv.Endpoint,
		Insecure: true, Region: "us-east-1", STS: &sourcev1.BucketSTSSpec{Provider: sourcev1.STSProviderAmazon, Endpoint: "https://" + host}})
	_, _, got, err := sourcetest.Fetch(t, src, req)
	must(t, err)
	if want := map[string]string{"app/config.yaml": "replicas: 3\n"}; !reflect.DeepEqual(got, want) {
		t.Errorf("files = %v, want %v", got, want)
	}
	if len(sts.Sessions()) == 0 {
		t.Fatal("the web identity was not exchanged at spec.sts.endpoint")
	}

	t.Run("another role", func(t *testing.T) {
		t.Setenv("AWS_ROLE_ARN", "arn:aws:iam::123456789012:role/someone-else")
		_, _, _, err := sourcetest.Fetch(t, src, req)
		sourcetest.CheckFailure(t, err, sourcev1.AuthenticationFailedReason, failure.Transient, "AWS authentication failed: ")
		if !strings.Contains(err.Error(), "Not authorized to perform sts:AssumeRoleWithWebIdentity") {
			t.Errorf("error %v does not carry STS's reason", err)
		}
	})
	t.Run("forged token", func(t *testing.T) {
		forged := filepath.Join(t.TempDir(), "token")
		must(t, os.WriteFile(forged, []byte("forged"), 0o600))
		t.Setenv("AWS_WEB_IDENTITY_TOKEN_FILE", forged)
		_, _, _, err := sourcetest.Fetch(t, src, req)
		sourcetest.CheckFailure(t, err, sourcev1.AuthenticationFailedReason, failure.Transient, "AWS authentication failed: ")
	})
	t.Run("STS unavailable", func(t *testing.T) {
		sts.FailWith(http.StatusServiceUnavailable)
		defer sts.FailWith(0)
		_, _, _, err := sourcetest.Fetch(t, src, req)
		sourcetest.CheckFailure(t, err, sourcev1.AuthenticationFailedReason, failure.Transient, "AWS authentication failed: ")
	})
}
