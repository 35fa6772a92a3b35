package role

import (
	"bytes"
	"context"
	"regexp"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"

	"github.com/headwater-gitops/headwater/pkg/events"
	"github.com/headwater-gitops/headwater/pkg/natskeys"
)

// TestPrint prints the Secrets as a GitOps repository would keep them and
// reads them back as Kubernetes does.
func TestPrint(t *testing.T) {
	t.Setenv("HEADWATER_S3_BUCKET", "from-env")
	var out, log bytes.Buffer
	err := run(context.Background(), []string{"print", "-namespace", "ops", "-s3-secret", "headwater-s3", "-s3-endpoint", "minio:9000", "-s3-insecure"}, &out, &log)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]corev1.Secret{}
	for _, doc := range regexp.MustCompile(`(?m)^---$`).Split(out.String(), -1) {
		var s corev1.Secret
		if err := yaml.UnmarshalStrict([]byte(doc), &s); err != nil {
			t.Fatalf("%v in:\n%s", err, doc)
		}
		if s.Kind != "Secret" || s.APIVersion != "v1" || s.Namespace != "ops" || len(s.Data) != 0 {
			t.Errorf("Secret %s: kind %s/%s, namespace %q, %d binary keys", s.Name, s.APIVersion, s.Kind, s.Namespace, len(s.Data))
		}
		got[s.Name] = s
	}
	for _, id := range events.Identities() {
		pub, err := natskeys.PublicKey(got[natskeys.SeedSecret(id)].StringData[natskeys.SeedKey])
		if err != nil {
			t.Errorf("%s: %v", id, err)
		} else if got[natskeys.UsersSecret].StringData[natskeys.EnvVar(id)] != pub {
			t.Errorf("%s: public key not in %s", id, natskeys.UsersSecret)
		}
	}
	s3 := got["headwater-s3"].StringData
	if s3["bucket"] != "from-env" || s3["endpoint"] != "minio:9000" || s3["insecure"] != "true" {
		t.Errorf("S3 Secret %v", s3)
	}
	if strings.Contains(out.String(), "creationTimestamp") {
		t.Errorf("printed Secrets carry server fields:\n%s", out.String())
	}
}

func TestUsage(t *testing.T) {
	for _, args := range [][]string{nil, {"frobnicate"}, {"print", "extra"}, {"print", "-s3-secret", "s"}} {
		if err := run(context.Background(), args, &bytes.Buffer{}, &bytes.Buffer{}); err == nil {
			t.Errorf("setup %q: no error", args)
		}
	}
}
