package deployvalidate

import "testing"

// tokenGrants are the ClusterRoles of m that may create ServiceAccount
// tokens, and the ServiceAccounts bound to each.
func tokenGrants(m *Manifests) map[string][]string {
	grants := map[string][]string{}
	for _, r := range m.ClusterRoles {
		if !Allows(r.Rules, "", "serviceaccounts/token", "create") {
			continue
		}
		grants[r.Name] = nil
		for _, b := range m.ClusterRoleBindings {
			if b.RoleRef.Name != r.Name {
				continue
			}
			for _, s := range b.Subjects {
				grants[r.Name] = append(grants[r.Name], s.Kind+"/"+s.Name)
			}
		}
	}
	return grants
}

// TestWorkloadIdentityComponent: the fetcher may create ServiceAccount
// tokens only with components/workload-identity, which also turns the
// ObjectLevelWorkloadIdentity gate on; no other pod ever may.
func TestWorkloadIdentityComponent(t *testing.T) {
	base, _ := build(t, "deploy/base")
	if g := tokenGrants(base); len(g) != 0 {
		t.Errorf("deploy/base grants serviceaccounts/token create: %v; only components/workload-identity may", g)
	}
	m, _ := buildWith(t, "workload-identity")
	g := tokenGrants(m)
	if len(g) != 1 || len(g["headwater-fetcher-workload-identity"]) != 1 || g["headwater-fetcher-workload-identity"][0] != "ServiceAccount/fetcher" {
		t.Errorf("serviceaccounts/token create granted to %v, want ClusterRole headwater-fetcher-workload-identity bound to ServiceAccount/fetcher only", g)
	}
	r, ok := m.ClusterRole("headwater-fetcher-workload-identity")
	if !ok {
		t.Fatal("no ClusterRole headwater-fetcher-workload-identity")
	}
	for _, rule := range r.Rules {
		if len(rule.Resources) != 1 || rule.Resources[0] != "serviceaccounts/token" || len(rule.Verbs) != 1 || rule.Verbs[0] != "create" {
			t.Errorf("ClusterRole headwater-fetcher-workload-identity grants %v on %v; it needs create on serviceaccounts/token only", rule.Verbs, rule.Resources)
		}
	}
	c, _ := container(t, m, "fetcher")
	if v, ok := EnvValue(c, "HEADWATER_FEATURE_GATES"); !ok || v != "ObjectLevelWorkloadIdentity=true" {
		t.Errorf("fetcher HEADWATER_FEATURE_GATES = %q, want ObjectLevelWorkloadIdentity=true", v)
	}
}
