package deployvalidate

import (
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// TestHAOverlay evaluates what overlays/ha promises a cluster of three
// nodes (components/ha on overlays/production): a lost node takes at most
// one NATS server and one replica of each service, and `kubectl drain` of a
// node finishes; and it is overlays/production but for that.
func TestHAOverlay(t *testing.T) {
	m, _ := build(t, filepath.Join("deploy", "overlays", "ha"))
	checkHA(t, m)
	production, err := Build(filepath.Join(repoRoot(t), "deploy", "overlays", "production"))
	if err != nil {
		t.Fatal(err)
	}
	if m.Count != production.Count+2 {
		t.Errorf("overlays/ha renders %d resources, want overlays/production's %d and the fetchers' and packagers' PodDisruptionBudgets", m.Count, production.Count)
	}
	checkS3Storage(t, m)
	checkSetup(t, m, false)
}

// TestHAComponent checks components/ha beside components/nats-cluster on
// deploy/base.
func TestHAComponent(t *testing.T) {
	m, _ := buildWith(t, "nats-cluster", "ha")
	checkHA(t, m)
}

func checkHA(t *testing.T, m *Manifests) {
	t.Helper()
	for _, p := range haProblems(m) {
		t.Error(p)
	}
}

// TestHAChecksCatchMistakes breaks overlays/ha in the ways that
// would lose a node's worth of work or block a drain, and expects
// haProblems to say so.
func TestHAChecksCatchMistakes(t *testing.T) {
	haOverlay := func(t *testing.T) *Manifests {
		t.Helper()
		m, _ := build(t, filepath.Join("deploy", "overlays", "ha"))
		return m
	}
	pdb := func(m *Manifests, name string) *policyv1.PodDisruptionBudget {
		for i := range m.PDBs {
			if m.PDBs[i].Name == name {
				return &m.PDBs[i]
			}
		}
		t.Fatalf("no PodDisruptionBudget %s", name)
		return nil
	}
	for _, tc := range []struct {
		name  string
		m     func(t *testing.T) *Manifests
		wants string
	}{
		{"overlays/production", func(t *testing.T) *Manifests {
			m, _ := build(t, filepath.Join("deploy", "overlays", "production"))
			return m
		}, "nats: servers may share a node"},
		{"no fetcher budget", func(t *testing.T) *Manifests {
			m := haOverlay(t)
			m.PDBs = slices.DeleteFunc(m.PDBs, func(p policyv1.PodDisruptionBudget) bool { return p.Name == "fetcher" })
			return m
		}, "Deployment fetcher: PodDisruptionBudgets [], want exactly one"},
		{"two budgets for the packagers", func(t *testing.T) *Manifests {
			m := haOverlay(t)
			extra := *pdb(m, "packager")
			extra.Name = "packager-too"
			m.PDBs = append(m.PDBs, extra)
			return m
		}, "Deployment packager: PodDisruptionBudgets [packager packager-too], want exactly one"},
		{"a budget that blocks a drain", func(t *testing.T) *Manifests {
			m := haOverlay(t)
			three := intstr.FromInt32(3)
			p := pdb(m, "artifact-server")
			p.Spec.MinAvailable = &three
			return m
		}, "Deployment artifact-server: budget artifact-server allows 0 disruptions"},
		{"a budget that lets the NATS quorum go", func(t *testing.T) *Manifests {
			m := haOverlay(t)
			two := intstr.FromInt32(2)
			pdb(m, "nats").Spec.MaxUnavailable = &two
			return m
		}, "nats: budget allows 2 servers down"},
		{"the fetchers not spread", func(t *testing.T) *Manifests {
			m := haOverlay(t)
			for i := range m.Deployments {
				if m.Deployments[i].Name == "fetcher" {
					m.Deployments[i].Spec.Template.Spec.TopologySpreadConstraints = nil
					m.Deployments[i].Spec.Template.Spec.Affinity = nil
				}
			}
			return m
		}, "Deployment fetcher: all 3 replicas may land on one node"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			problems := haProblems(tc.m(t))
			if !slices.ContainsFunc(problems, func(p string) bool { return strings.HasPrefix(p, tc.wants) }) {
				t.Errorf("problems %q, want one starting %q", problems, tc.wants)
			}
		})
	}
}

// haProblems says what in m would lose more than a node's share of any
// workload on a three-node cluster, or block a drain.
func haProblems(m *Manifests) []string {
	var problems []string
	errorf := func(format string, args ...any) { problems = append(problems, fmt.Sprintf(format, args...)) }
	const nodes = 3
	for _, w := range m.Workloads() {
		if !w.LongRunning() {
			continue
		}
		spec := w.Template.Spec
		perNode := w.Replicas // what one node may hold, at worst
		// A hard rule bounds what one node holds; a soft one is where
		// the scheduler puts them when it can.
		switch {
		case requiredOnePerNode(spec, w.Template.Labels):
			perNode = 1
		case spreadsEvenly(spec, w.Template.Labels, "kubernetes.io/hostname", false):
			perNode = (w.Replicas + nodes - 1) / nodes
		}
		if w.Name == "nats" && !requiredOnePerNode(spec, w.Template.Labels) && !spreadsEvenly(spec, w.Template.Labels, "kubernetes.io/hostname", true) {
			errorf("nats: servers may share a node (no required anti-affinity or DoNotSchedule spread on kubernetes.io/hostname): losing it loses the quorum")
		}
		if w.Replicas < 2 {
			errorf("%s %s: %d replica: a lost node takes it all", w.Kind, w.Name, w.Replicas)
			continue
		}
		if perNode >= w.Replicas {
			errorf("%s %s: all %d replicas may land on one node (no anti-affinity or topology spread)", w.Kind, w.Name, w.Replicas)
		}
		if w.Name != "nats" && !spreadsEvenly(spec, w.Template.Labels, "topology.kubernetes.io/zone", false) {
			errorf("%s %s: not spread over zones", w.Kind, w.Name)
		}
		// A drain evicts the node's pods through their budgets: every
		// long-running workload has exactly one (the eviction API refuses
		// a pod that two select), and it lets the node's share go while
		// the others run.
		var budgets []string
		allowed := int32(-1)
		for _, p := range m.PDBs {
			sel, err := metav1.LabelSelectorAsSelector(p.Spec.Selector)
			if err != nil {
				errorf("PodDisruptionBudget %s: %v", p.Name, err)
				continue
			}
			if !sel.Matches(labels.Set(w.Template.Labels)) {
				continue
			}
			budgets = append(budgets, p.Name)
			switch {
			case p.Spec.MaxUnavailable != nil:
				allowed = int32(p.Spec.MaxUnavailable.IntValue())
			case p.Spec.MinAvailable != nil:
				allowed = w.Replicas - int32(p.Spec.MinAvailable.IntValue())
			}
		}
		if len(budgets) != 1 {
			errorf("%s %s: PodDisruptionBudgets %v, want exactly one", w.Kind, w.Name, budgets)
			continue
		}
		if allowed < perNode {
			errorf("%s %s: budget %s allows %d disruptions, a node may hold %d: a drain would not finish", w.Kind, w.Name, budgets[0], allowed, perNode)
		}
		if allowed >= w.Replicas {
			errorf("%s %s: budget %s allows all %d replicas down", w.Kind, w.Name, budgets[0], w.Replicas)
		}
		if w.Name == "nats" && allowed != 1 {
			errorf("nats: budget allows %d servers down; JetStream's quorum of 3 survives one", allowed)
		}
	}
	for _, name := range []string{"fetcher", "packager", "artifact-server"} {
		d, ok := m.Deployment(name)
		if !ok {
			errorf("no Deployment %s", name)
			continue
		}
		if d.Spec.Replicas == nil || *d.Spec.Replicas < nodes {
			errorf("%s: %v replicas, want one per node of %d", name, d.Spec.Replicas, nodes)
		}
	}
	return problems
}

// requiredOnePerNode reports whether spec's required anti-affinity keeps
// two pods with podLabels off one node.
func requiredOnePerNode(spec corev1.PodSpec, podLabels map[string]string) bool {
	if spec.Affinity == nil || spec.Affinity.PodAntiAffinity == nil {
		return false
	}
	for _, term := range spec.Affinity.PodAntiAffinity.RequiredDuringSchedulingIgnoredDuringExecution {
		sel, err := metav1.LabelSelectorAsSelector(term.LabelSelector)
		if err == nil && term.TopologyKey == "kubernetes.io/hostname" && sel.Matches(labels.Set(podLabels)) {
			return true
		}
	}
	return false
}

// spreadsEvenly reports whether spec spreads pods with podLabels over key
// with a skew of one (hard: whenUnsatisfiable DoNotSchedule).
func spreadsEvenly(spec corev1.PodSpec, podLabels map[string]string, key string, hard bool) bool {
	for _, c := range spec.TopologySpreadConstraints {
		sel, err := metav1.LabelSelectorAsSelector(c.LabelSelector)
		if err == nil && c.TopologyKey == key && c.MaxSkew == 1 && sel.Matches(labels.Set(podLabels)) &&
			(!hard || c.WhenUnsatisfiable == corev1.DoNotSchedule) {
			return true
		}
	}
	return false
}
