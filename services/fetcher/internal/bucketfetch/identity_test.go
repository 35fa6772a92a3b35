package bucketfetch

import (
	"strings"
	"testing"

	"github.com/fluxcd/pkg/apis/meta"
	sourcev1 "github.com/fluxcd/source-controller/api/v1"
)

func TestContentIdentity(t *testing.T) {
	spec := func() *sourcev1.BucketSpec {
		return &sourcev1.BucketSpec{Provider: "generic", BucketName: "b", Endpoint: "minio:9000", Prefix: "p/",
			SecretRef: &meta.LocalObjectReference{Name: "creds"}}
	}
	ident := func(namespace string, s *sourcev1.BucketSpec, rules []byte) string {
		r := &resolved{bucket: s.BucketName, prefix: s.Prefix, ignore: s.Ignore, rules: rules, identity: identity(namespace, s)}
		parts, ok := r.ContentIdentity()
		if !ok {
			t.Fatal("a bucket is not shareable")
		}
		return strings.Join(parts, "\x00")
	}
	want := ident("default", spec(), nil)
	if again := ident("default", spec(), nil); again != want {
		t.Fatalf("identity changed: %q, %q", want, again)
	}
	ignore := "*.md"
	differ := map[string]func(ns *string, s *sourcev1.BucketSpec, rules *[]byte){
		"namespace":         func(ns *string, _ *sourcev1.BucketSpec, _ *[]byte) { *ns = "other" },
		"secret":            func(_ *string, s *sourcev1.BucketSpec, _ *[]byte) { s.SecretRef.Name = "other" },
		"no secret":         func(_ *string, s *sourcev1.BucketSpec, _ *[]byte) { s.SecretRef = nil },
		"service account":   func(_ *string, s *sourcev1.BucketSpec, _ *[]byte) { s.ServiceAccountName = "sa" },
		"endpoint":          func(_ *string, s *sourcev1.BucketSpec, _ *[]byte) { s.Endpoint = "minio:9001" },
		"insecure":          func(_ *string, s *sourcev1.BucketSpec, _ *[]byte) { s.Insecure = true },
		"bucket":            func(_ *string, s *sourcev1.BucketSpec, _ *[]byte) { s.BucketName = "c" },
		"prefix":            func(_ *string, s *sourcev1.BucketSpec, _ *[]byte) { s.Prefix = "q/" },
		"ignore":            func(_ *string, s *sourcev1.BucketSpec, _ *[]byte) { s.Ignore = &ignore },
		"ignore rules file": func(_ *string, _ *sourcev1.BucketSpec, r *[]byte) { *r = []byte("*.md\n") },
	}
	seen := map[string]string{want: "base"}
	for name, change := range differ {
		ns, s, rules := "default", spec(), []byte(nil)
		change(&ns, s, &rules)
		got := ident(ns, s, rules)
		if prev, dup := seen[got]; dup {
			t.Errorf("%s: same identity as %s", name, prev)
		}
		seen[got] = name
	}
}
