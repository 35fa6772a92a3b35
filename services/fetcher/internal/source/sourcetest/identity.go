package sourcetest

import (
	"maps"
	"net/http"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// CreateServiceAccounts creates in namespace default of the API server of
// c (see StartAPIServer) a ServiceAccount of each name of accounts, with
// its annotations (nil: none): the identities an object-level workload
// identity test logs in as, whose TokenRequest tokens the API server
// signs for the audience the fetcher asks.
func CreateServiceAccounts(t *testing.T, c client.Client, accounts map[string]map[string]string) {
	t.Helper()
	for name, annotations := range accounts {
		sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name, Annotations: maps.Clone(annotations)}}
		if err := c.Create(t.Context(), sa); err != nil {
			t.Fatalf("create ServiceAccount default/%s: %v", name, err)
		}
	}
}

// Getenv looks up env: a source's Getenv in place of the process
// environment, so that a test points the clouds' SDKs at its token
// endpoints without setting the process's variables.
func Getenv(env map[string]string) func(string) (string, bool) {
	return func(k string) (string, bool) { v, ok := env[k]; return v, ok }
}

// BearerValid reports whether r carries an Authorization bearer token
// that valid accepts: the check of a test front (a bucket, a git server)
// that lets through only the tokens a test token endpoint issued.
func BearerValid(r *http.Request, valid func(token string) bool) bool {
	token, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	return ok && valid(token)
}

// CheckRefusesForgedBearer fails t unless the test front at url, reached
// with hc (nil: http.DefaultClient), answers want to a GET without a
// token and to one with a bearer token it never issued: a front that
// stopped checking tokens would let every workload identity test pass on
// an anonymous request.
func CheckRefusesForgedBearer(t *testing.T, hc *http.Client, url string, want int) {
	t.Helper()
	if hc == nil {
		hc = http.DefaultClient
	}
	for _, auth := range []string{"", "Bearer forged-" + strings.Repeat("x", 32)} {
		req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, url, nil)
		if err != nil {
			t.Fatal(err)
		}
		if auth != "" {
			req.Header.Set("Authorization", auth)
		}
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatalf("GET %s: %v", url, err)
		}
		_ = resp.Body.Close()
		if resp.StatusCode != want {
			t.Errorf("GET %s with Authorization %q: %s, want %d", url, auth, resp.Status, want)
		}
	}
}
