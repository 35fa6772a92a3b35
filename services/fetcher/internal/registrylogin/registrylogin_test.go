package registrylogin

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"

	"github.com/headwater-gitops/headwater/pkg/failure"
	"github.com/headwater-gitops/headwater/services/fetcher/internal/providertoken"
)

// TestHostPatterns: a registry the provider does not serve is refused
// before any token is asked for (the environment is empty, so a host that
// passes fails for want of an identity instead), with Flux's message.
func TestHostPatterns(t *testing.T) {
	l := &Login{Getenv: func(string) (string, bool) { return "", false }}
	cases := []struct {
		provider, registry string
		served             bool
		message            string
	}{
		{AWS, "123456789012.dkr.ecr.us-east-1.amazonaws.com", true, ""},
		{AWS, "123456789012.dkr.ecr-fips.us-gov-west-1.amazonaws.com", true, ""},
		{AWS, "123456789012.dkr.ecr.cn-north-1.amazonaws.com.cn", true, ""},
		{AWS, "123456789012.dkr-ecr.eu-west-1.on.aws", true, ""},
		{AWS, "12345.dkr.ecr.us-east-1.amazonaws.com", false, "invalid AWS registry: '12345.dkr.ecr.us-east-1.amazonaws.com'. must match "},
		{AWS, "ghcr.io", false, "invalid AWS registry: 'ghcr.io'"},
		{AWS, "public.ecr.aws", false, "ECR Public ('public.ecr.aws') is not supported"},
		{Azure, "myregistry.azurecr.io", true, ""},
		{Azure, "myregistry.azurecr.us", true, ""},
		{Azure, "azurecr.io", false, "invalid Azure registry: 'azurecr.io'"},
		{Azure, "myregistry.azurecr.io.evil.com", false, "invalid Azure registry"},
		{GCP, "gcr.io", true, ""},
		{GCP, "eu.gcr.io", true, ""},
		{GCP, "europe-west1-docker.pkg.dev", true, ""},
		{GCP, "docker.io", false, "invalid GCP registry: 'docker.io'"},
		{"oracle", "ocir.io", false, "unknown provider 'oracle'"},
	}
	for _, tc := range cases {
		t.Run(tc.provider+" "+tc.registry, func(t *testing.T) {
			// GCP's metadata server would be dialled: point it nowhere.
			l.Getenv = func(k string) (string, bool) {
				if k == providertoken.EnvGCEMetadataHost {
					return "127.0.0.1:1", true
				}
				return "", false
			}
			_, err := l.Credentials(context.Background(), tc.provider, "default", tc.registry, nil, nil)
			if err == nil {
				t.Fatal("login without an identity succeeded")
			}
			if got := errors.Is(err, ErrInvalidRegistry); got == tc.served {
				t.Fatalf("error %q: invalid registry %v, want %v", err, got, !tc.served)
			}
			if tc.served {
				if h := Handling(err); h == failure.Stalling {
					t.Errorf("a served registry without identity: handling %s, want final or transient (%v)", h, err)
				}
				return
			}
			if !strings.Contains(err.Error(), tc.message) || Handling(err) != failure.Stalling {
				t.Errorf("error %q (%s), want stalling with %q", err, Handling(err), tc.message)
			}
		})
	}
}

func TestHandling(t *testing.T) {
	refused := &providertoken.ResponseError{StatusCode: http.StatusForbidden}
	cases := []struct {
		err  error
		want failure.Handling
	}{
		{invalidf("invalid AWS registry"), failure.Stalling},
		{refused, failure.Final},
		{&providertoken.ConfigError{Err: errors.New("no identity")}, failure.Final},
		{&providertoken.ResponseError{StatusCode: http.StatusTooManyRequests}, failure.Transient},
		{&providertoken.ResponseError{StatusCode: http.StatusInternalServerError}, failure.Transient},
		{context.DeadlineExceeded, failure.Transient},
	}
	for _, tc := range cases {
		if got := Handling(tc.err); got != tc.want {
			t.Errorf("Handling(%v) = %s, want %s", tc.err, got, tc.want)
		}
	}
}
