package e2e

import (
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/fluxcd/pkg/apis/meta"
	sourcev1 "github.com/fluxcd/source-controller/api/v1"
	"github.com/minio/minio-go/v7/pkg/credentials"
	corev1 "k8s.io/api/core/v1"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/headwater-gitops/headwater/e2e/harness"
	"github.com/headwater-gitops/headwater/testsupport/cloudid"
	"github.com/headwater-gitops/headwater/testsupport/miniotest"
	"github.com/headwater-gitops/headwater/testsupport/tokenserver"
)

// wiRole is the IAM role the test's STS lets the ServiceAccount
// default/wi-reader assume.
const wiRole = "arn:aws:iam::123456789012:role/tenant-bucket-reader"

// TestObjectLevelWorkloadIdentity runs a fetcher with
// -feature-gates=ObjectLevelWorkloadIdentity=true (an Env of its own, as
// components/workload-identity deploys it) against a real API server: a
// Bucket with provider aws and spec.serviceAccountName is read as that
// ServiceAccount. The fetcher asks the TokenRequest API for a token of
// default/wi-reader; the test's STS (at the fetcher's
// AWS_ENDPOINT_URL_STS) accepts it only for the role the ServiceAccount's
// eks.amazonaws.com/role-arn names, with subject
// system:serviceaccount:default:wi-reader and audience sts.amazonaws.com,
// and answers with credentials of MinIO's own STS, which the bucket
// accepts. Then the bad-input rows of the gate: a missing ServiceAccount,
// one whose role the STS refuses (a wrong role ARN, or a ServiceAccount the
// role does not trust) and an STS answering 500, each a Ready False
// AuthenticationFailed with what is wrong and a Warning Event, never
// Stalled (the next interval tries again).
func TestObjectLevelWorkloadIdentity(t *testing.T) {
	requireEnv(t)
	t.Parallel()
	srv := miniotest.New(t)
	const bucket = "wibucket"
	srv.MakeBucket(t, bucket)
	putObject(t, srv, bucket, "app/config.yaml", "replicas: 3\n")
	sts := &tokenserver.AWSSTS{
		Trust: cloudid.ServiceAccountTrust("sts.amazonaws.com", map[string]string{wiRole: namespace + "/wi-reader"}),
		Mint: func() (string, string, string, time.Time, error) {
			c, err := credentials.NewSTSAssumeRole(srv.URL(), credentials.STSAssumeRoleOptions{AccessKey: srv.AccessKey, SecretKey: srv.SecretKey})
			if err != nil {
				return "", "", "", time.Time{}, err
			}
			v, err := c.GetWithContext(&credentials.CredContext{Client: http.DefaultClient})
			return v.AccessKeyID, v.SecretAccessKey, v.SessionToken, v.Expiration, err
		},
	}
	// MinIO's STS answers "Server not initialized" while its IAM starts.
	eventually(t, "MinIO's STS mints", func() error { _, _, _, _, err := sts.Mint(); return err })
	if err := sts.Start("127.0.0.1:0", "localhost"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sts.Stop() })
	caFile := filepath.Join(t.TempDir(), "sts-ca.pem")
	if err := os.WriteFile(caFile, sts.CACertPEM(), 0o600); err != nil {
		t.Fatal(err)
	}
	e := startPrivateEnv(t, "workload-identity", func(cfg *harness.Config) {
		cfg.ExtraArgs[harness.Fetcher] = append(cfg.ExtraArgs[harness.Fetcher], "-feature-gates=ObjectLevelWorkloadIdentity=true")
		// The STS endpoint is the operator's (as a VPC endpoint would
		// be); the fetcher trusts the test STS's authority.
		cfg.Env = append(cfg.Env, "AWS_ENDPOINT_URL_STS=https://localhost:"+sts.Addr()[strings.LastIndex(sts.Addr(), ":")+1:], "SSL_CERT_FILE="+caFile)
	})
	ctx := t.Context()
	for name, arn := range map[string]string{"wi-reader": wiRole, "wi-wrong-role": "arn:aws:iam::123456789012:role/someone-else",
		"wi-untrusted": wiRole} {
		sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name,
			Annotations: map[string]string{"eks.amazonaws.com/role-arn": arn}}}
		if err := e.Client.Create(ctx, sa); err != nil {
			t.Fatal(err)
		}
	}
	create := func(name, sa string) {
		t.Helper()
		b := &sourcev1.Bucket{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name},
			Spec: sourcev1.BucketSpec{Provider: sourcev1.BucketProviderAmazon, BucketName: bucket, Endpoint: srv.Endpoint,
				Insecure: true, Region: "us-east-1", ServiceAccountName: sa, Interval: metav1.Duration{Duration: time.Minute}}}
		if err := e.Client.Create(ctx, b); err != nil {
			t.Fatal(err)
		}
	}
	get := func(name string) *sourcev1.Bucket {
		var b sourcev1.Bucket
		if err := e.Client.Get(ctx, client.ObjectKey{Namespace: namespace, Name: name}, &b); err != nil {
			t.Fatal(err)
		}
		return &b
	}

	create("wi-bucket", "wi-reader")
	var ready *sourcev1.Bucket
	eventually(t, "Bucket wi-bucket Ready with an artifact", func() error {
		ready = get("wi-bucket")
		c := apimeta.FindStatusCondition(ready.Status.Conditions, meta.ReadyCondition)
		switch {
		case c == nil:
			return errors.New("no Ready condition")
		case c.Status != metav1.ConditionTrue:
			return fmt.Errorf("Ready=%s %s: %s", c.Status, c.Reason, c.Message)
		case ready.Status.Artifact == nil:
			return errors.New("no artifact")
		}
		return nil
	})
	if files := untarArtifact(t, download(t, ready.Status.Artifact.URL)); files["app/config.yaml"] != "replicas: 3\n" {
		t.Errorf("artifact files %v", files)
	}
	if want := "wi-reader." + namespace + ".us-east-1.fluxcd.io"; !slices.Contains(sts.Sessions(), want) {
		t.Errorf("STS role sessions %q, want Flux's %s", sts.Sessions(), want)
	}

	rows := []struct {
		name, sa string
		fault    func() func()
		inMsg    string
	}{
		{name: "wi-sa-missing", sa: "wi-absent", inMsg: "failed to get service account '" + namespace + "/wi-absent'"},
		{name: "wi-wrong-role", sa: "wi-wrong-role", inMsg: "AccessDenied"},
		{name: "wi-untrusted", sa: "wi-untrusted", inMsg: "system:serviceaccount:" + namespace + ":wi-untrusted"},
		// wi-reader's credentials are in the fetcher's cache now (a
		// Bucket of the same ServiceAccount would not ask STS): a
		// ServiceAccount with none cached meets the outage.
		{name: "wi-sts-500", sa: "wi-untrusted", inMsg: "StatusCode: 500",
			fault: func() func() { sts.FailWith(http.StatusInternalServerError); return func() { sts.FailWith(0) } }},
	}
	for _, row := range rows {
		t.Run(row.name, func(t *testing.T) {
			if row.fault != nil {
				defer row.fault()()
			}
			create(row.name, row.sa)
			var c *metav1.Condition
			eventually(t, row.name+" Ready False AuthenticationFailed", func() error {
				b := get(row.name)
				c = apimeta.FindStatusCondition(b.Status.Conditions, meta.ReadyCondition)
				if c == nil || c.Status != metav1.ConditionFalse || c.Reason != sourcev1.AuthenticationFailedReason {
					return fmt.Errorf("Ready %+v", c)
				}
				if s := apimeta.FindStatusCondition(b.Status.Conditions, meta.StalledCondition); s != nil && s.Status == metav1.ConditionTrue {
					return fmt.Errorf("Stalled: %s", s.Message)
				}
				return nil
			})
			if !strings.Contains(c.Message, row.inMsg) {
				t.Errorf("Ready message %q does not say %q", c.Message, row.inMsg)
			}
			eventually(t, "a Warning Event AuthenticationFailed on "+row.name, func() error {
				var list corev1.EventList
				if err := e.Client.List(ctx, &list, client.InNamespace(namespace)); err != nil {
					return err
				}
				for _, ev := range list.Items {
					if ev.InvolvedObject.Kind == sourcev1.BucketKind && ev.InvolvedObject.Name == row.name &&
						ev.Type == corev1.EventTypeWarning && ev.Reason == sourcev1.AuthenticationFailedReason {
						return nil
					}
				}
				return errors.New("none yet")
			})
		})
	}
}
