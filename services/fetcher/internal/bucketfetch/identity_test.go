package bucketfetch

import (
	"strings"
	"testing"

	"github.com/fluxcd/pkg/apis/meta"
	sourcev1 "github.com/fluxcd/source-controller/api/v1"

	"github.com/headwater-gitops/headwater/services/fetcher/internal/secrets"
)

func TestContentIdentity(t *testing.T) {
	keys := map[string][]byte{"accesskey": []byte("AKIA"), "secretkey": []byte("s3cr3t")}
	spec := func() *sourcev1.BucketSpec {
		return &sourcev1.BucketSpec{Provider: "generic", BucketName: "b", Endpoint: "minio:9000", Prefix: "p/",
			SecretRef: &meta.LocalObjectReference{Name: "creds"}}
	}
	type source struct {
		ns     string
		spec   *sourcev1.BucketSpec
		rules  []byte
		access string
	}
	base := func() *source {
		return &source{ns: "default", spec: spec(), access: secrets.Fingerprint(keys, nil, nil)}
	}
	ident := func(s *source) string {
		r := &resolved{bucket: s.spec.BucketName, prefix: s.spec.Prefix, ignore: s.spec.Ignore, rules: s.rules,
			identity: identity(s.ns, s.spec, s.access, nil)}
		parts, ok := r.ContentIdentity()
		if !ok {
			t.Fatal("a bucket is not shareable")
		}
		if strings.Contains(strings.Join(parts, " "), "s3cr3t") {
			t.Fatalf("identity %q holds the secret key", parts)
		}
		return strings.Join(parts, "\x00")
	}
	want := ident(base())
	same := map[string]func(s *source){
		"the same keys in another Secret":    func(s *source) { s.spec.SecretRef.Name = "copy-of-creds" },
		"the same keys in another namespace": func(s *source) { s.ns = "team-b" },
	}
	for name, change := range same {
		s := base()
		change(s)
		if got := ident(s); got != want {
			t.Errorf("%s: identity %q, want %q", name, got, want)
		}
	}
	ignore := "*.md"
	differ := map[string]func(s *source){
		"a rotated key in the same Secret": func(s *source) {
			s.access = secrets.Fingerprint(map[string][]byte{"accesskey": []byte("AKIA"), "secretkey": []byte("rotated")}, nil, nil)
		},
		"no secret":         func(s *source) { s.spec.SecretRef, s.access = nil, secrets.Fingerprint(nil, nil, nil) },
		"another CA":        func(s *source) { s.access = secrets.Fingerprint(keys, nil, map[string][]byte{"ca.crt": []byte("ca")}) },
		"service account":   func(s *source) { s.spec.ServiceAccountName = "sa" },
		"endpoint":          func(s *source) { s.spec.Endpoint = "minio:9001" },
		"insecure":          func(s *source) { s.spec.Insecure = true },
		"bucket":            func(s *source) { s.spec.BucketName = "c" },
		"prefix":            func(s *source) { s.spec.Prefix = "q/" },
		"ignore":            func(s *source) { s.spec.Ignore = &ignore },
		"ignore rules file": func(s *source) { s.rules = []byte("*.md\n") },
	}
	seen := map[string]string{want: "base"}
	for name, change := range differ {
		s := base()
		change(s)
		got := ident(s)
		if prev, dup := seen[got]; dup {
			t.Errorf("%s: same identity as %s", name, prev)
		}
		seen[got] = name
	}
	// A service account is a namespace's own.
	a, b := base(), base()
	a.spec.ServiceAccountName, b.spec.ServiceAccountName, b.ns = "sa", "sa", "team-b"
	if ident(a) == ident(b) {
		t.Error("service accounts of two namespaces share an identity")
	}
}
