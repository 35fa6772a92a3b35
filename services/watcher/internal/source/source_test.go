package source

import (
	"context"
	"strings"
	"testing"

	sourcev1 "github.com/fluxcd/source-controller/api/v1"

	"github.com/headwater-gitops/headwater/pkg/events"
	"github.com/headwater-gitops/headwater/pkg/failure"
)

func TestRefuseCredentials(t *testing.T) {
	tests := []struct {
		raw     string
		refused bool
	}{
		{"https://github.com/stefanprodan/podinfo", false},
		{"ssh://git@github.com/stefanprodan/podinfo", false},
		{"ssh://git:s3cr3t@github.com/stefanprodan/podinfo", true},
		{"https://x-access-token:s3cr3t@github.com/org/repo.git", true},
		{"https://user@example.com/repo.git", true},
		{"minio.example.com:9000", false},
		{"AKIA:s3cr3t@minio.example.com:9000", true},
		{"http://[::1", false}, // unparsable: the fetcher reports it
	}
	for _, tc := range tests {
		err := refuseCredentials("spec.url", tc.raw)
		if (err != nil) != tc.refused {
			t.Errorf("%q: refused = %v, want %v", tc.raw, err != nil, tc.refused)
			continue
		}
		if err == nil {
			continue
		}
		f := failure.As(err)
		if f == nil || f.Handling != failure.Stalling || f.Reason != sourcev1.URLInvalidReason || f.Condition != sourcev1.FetchFailedCondition {
			t.Errorf("%q: %+v, want a stalling FetchFailed/URLInvalid", tc.raw, f)
		}
		if strings.Contains(err.Error(), "s3cr3t") || !strings.Contains(err.Error(), "spec.secretRef") {
			t.Errorf("%q: message %q must not repeat the credentials and must name spec.secretRef", tc.raw, err.Error())
		}
	}
}

// TestHelmRepositoryRefusesCredentials checks that a HelmRepository whose
// URL carries credentials makes no job.
func TestHelmRepositoryRefusesCredentials(t *testing.T) {
	h := &sourcev1.HelmRepository{Spec: sourcev1.HelmRepositorySpec{URL: "https://user:s3cr3t@charts.example.com"}}
	req := &events.FetchRequested{}
	_, err := HelmRepository().Request(context.Background(), nil, h, req)
	if f := failure.As(err); f == nil || f.Reason != sourcev1.URLInvalidReason || req.HelmRepository != nil {
		t.Fatalf("Request = %v with spec %v, want URLInvalid and no spec", err, req.HelmRepository)
	}
}
