package workloadidentity

import (
	"testing"

	"github.com/fluxcd/pkg/apis/meta"
	sourcev1 "github.com/fluxcd/source-controller/api/v1"

	"github.com/headwater-gitops/headwater/pkg/failure"
	"github.com/headwater-gitops/headwater/services/fetcher/internal/source/sourcetest"
)

// TestResolveWithoutAccount: which ServiceAccount a source authenticates
// as, before any API call: none without a name and a default; with the
// gate off a name stalls with Flux's FeatureGateDisabled; the default
// applies only with the gate.
func TestResolveWithoutAccount(t *testing.T) {
	for _, tc := range []struct {
		name     string
		accounts *Accounts
		sa       string
		reason   string
		handling failure.Handling
		message  string
	}{
		{name: "gate off, no name", accounts: nil},
		{name: "gate off, a default set", accounts: &Accounts{Default: "tenant"}},
		{name: "gate on, no name, no default", accounts: &Accounts{Enabled: true}},
		{name: "gate off, a name", accounts: &Accounts{}, sa: "tenant",
			reason: meta.FeatureGateDisabledReason, handling: failure.Stalling, message: GateMessage},
		{name: "nil accounts, a name", accounts: nil, sa: "tenant",
			reason: meta.FeatureGateDisabledReason, handling: failure.Stalling, message: GateMessage},
		{name: "gate on, no cluster", accounts: &Accounts{Enabled: true}, sa: "tenant",
			reason: sourcev1.AuthenticationFailedReason, handling: failure.Transient, message: "no Kubernetes API server is configured"},
		{name: "gate on, default, no cluster", accounts: &Accounts{Enabled: true, Default: "tenant"},
			reason: sourcev1.AuthenticationFailedReason, handling: failure.Transient, message: "failed to get service account 'team-a/tenant'"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, err := tc.accounts.Resolve(t.Context(), "team-a", tc.sa)
			if tc.reason == "" {
				if err != nil || a != nil {
					t.Fatalf("Resolve = %v, %v; want the fetcher's own identity", a, err)
				}
				return
			}
			sourcetest.CheckFailure(t, err, tc.reason, tc.handling, tc.message)
		})
	}
}
