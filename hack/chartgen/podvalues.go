package main

import (
	"fmt"
	"regexp"
	"strings"
)

// The settings every chart user expects per workload (nodeSelector,
// tolerations, extra flags, ...) and the names a release owns are not
// choices of kustomization: they are set in each rendering as tokens that
// Template turns into template text, in three forms that render nothing
// (the text kustomize renders) while the value is empty.
//
//   - override: a key of a map whose value the chart's value replaces when
//     set (`{{ with V }}key: V{{ else }}deploy/'s key, if any{{ end }}`);
//   - items: items appended to a list (the container's args and env);
//   - entries: entries added to a map (the pod's labels and annotations).
//
// An override's text opens a `with` on one line and closes it on another,
// so those two lines must be unguarded by the choices (Emit checks it);
// every other token is one balanced line.

// A PodValue is a setting of a workload's pod that the chart's values set.
type PodValue struct {
	// Key is the value's name under .Values.<workload>.
	Key string
	// Field is the pod spec's field it sets.
	Field string
	// Expr is the template expression of the value, %[1]s standing for
	// .Values.<workload>.
	Expr string
	// Scalar is true for a string (rendered quoted), false for YAML.
	Scalar bool
}

// PodValues are the pod spec's fields the chart's values replace. Those
// with a global default (the same key at the top of values.yaml) take it
// when the workload's own is empty.
var PodValues = []PodValue{
	{"affinity", "affinity", "%[1]s.affinity", false},
	{"nodeSelector", "nodeSelector", "%[1]s.nodeSelector | default .Values.nodeSelector", false},
	{"tolerations", "tolerations", "%[1]s.tolerations | default .Values.tolerations", false},
	{"topologySpreadConstraints", "topologySpreadConstraints", "%[1]s.topologySpreadConstraints", false},
	{"priorityClassName", "priorityClassName", "%[1]s.priorityClassName | default .Values.priorityClassName", true},
	{"podSecurityContext", "securityContext", "%[1]s.podSecurityContext", false},
	{"imagePullSecrets", "imagePullSecrets", ".Values.imagePullSecrets", false},
}

// markers end lines of template text that Emit treats specially; it
// removes them.
const (
	// noNewline: the line writes its own newline (none while it renders
	// nothing).
	noNewline = "{{/*chartgen:nonl*/}}"
	// unguarded: the line opens or closes an action that spans lines, so
	// no choice may guard it.
	unguarded = "{{/*chartgen:unguarded*/}}"
)

// podSettings puts the tokens of the pod's settings into the pod template
// (spec.template) of workload w and its container c.
func (p *Parameterizer) podSettings(w Workload, template, pod, c map[string]any) error {
	values := ".Values." + w.Key
	for _, v := range PodValues {
		expr := v.Expr
		if strings.Contains(expr, "%[1]s") {
			expr = fmt.Sprintf(expr, values)
		}
		p.override(pod, v.Field, w.Key+"."+v.Key, expr, v.Scalar)
	}
	p.override(c, "securityContext", w.Key+".securityContext", values+".securityContext", false)
	if err := p.appendItems(c, "args", w.Key+".extraArgs", values+".extraArgs"); err != nil {
		return err
	}
	if err := p.appendItems(c, "env", w.Key+".extraEnv", values+".extraEnv"); err != nil {
		return err
	}
	md, err := mapAt(template, "metadata")
	if err != nil {
		return err
	}
	if err := p.addEntries(md, "labels", w.Key+".podLabels",
		fmt.Sprintf("merge (dict) %s.podLabels .Values.podLabels", values)); err != nil {
		return err
	}
	return p.addEntries(md, "annotations", w.Key+".podAnnotations",
		fmt.Sprintf("merge (dict) %s.podAnnotations .Values.podAnnotations", values))
}

// override makes m[key] the value of expr when that is set, and what it
// is (or nothing) otherwise.
func (p *Parameterizer) override(m map[string]any, key, name, expr string, scalar bool) {
	kind := "override"
	if scalar {
		kind = "overridescalar"
	}
	m[key] = map[string]any{p.token(kind, name, expr): m[key]}
}

// appendItems appends the items of the list expr to the list m[key], or
// makes it m[key] where m has none.
func (p *Parameterizer) appendItems(m map[string]any, key, name, expr string) error {
	switch l := m[key].(type) {
	case nil:
		p.override(m, key, name, expr, false)
	case []any:
		m[key] = append(l, p.token("items", name, expr))
	default:
		return fmt.Errorf("%s is not a list", key)
	}
	return nil
}

// addEntries adds the entries of the map expr to the map m[key], or makes
// it m[key] where m has none.
func (p *Parameterizer) addEntries(m map[string]any, key, name, expr string) error {
	switch e := m[key].(type) {
	case nil:
		p.override(m, key, name, expr, false)
	case map[string]any:
		e[p.token("entries", name, expr)] = "x"
	default:
		return fmt.Errorf("%s is not a map", key)
	}
	return nil
}

var (
	overrideToken = regexp.MustCompile(`^( *)(HWTMPL\.override(scalar)?\.\S+\.HWEND):(?: (.*))?$`)
	keyLine       = regexp.MustCompile(`^( *)([^ :]+):$`)
	itemsToken    = regexp.MustCompile(`^( *)- (HWTMPL\.items\.\S+\.HWEND)$`)
	entriesToken  = regexp.MustCompile(`^( *)(HWTMPL\.entries\.\S+\.HWEND): x$`)
)

// expandStructural turns the override, items and entries tokens of
// marshalled YAML into template text.
func (p *Parameterizer) expandStructural(y string) (string, error) {
	lines := strings.Split(y, "\n")
	var out []string
	for i := 0; i < len(lines); i++ {
		l := lines[i]
		if m := itemsToken.FindStringSubmatch(l); m != nil {
			expr, ok := p.block[m[2]]
			if !ok {
				return "", fmt.Errorf("unknown token %s", m[2])
			}
			out = append(out, fmt.Sprintf(`{{ with %s }}{{ toYaml . | indent %d }}{{ "\n" }}{{ end }}`, expr, len(m[1]))+noNewline)
			continue
		}
		if m := entriesToken.FindStringSubmatch(l); m != nil {
			expr, ok := p.block[m[2]]
			if !ok {
				return "", fmt.Errorf("unknown token %s", m[2])
			}
			out = append(out, fmt.Sprintf(`{{ with %s }}{{ toYaml . | indent %d }}{{ "\n" }}{{ end }}`, expr, len(m[1]))+noNewline)
			continue
		}
		k := keyLine.FindStringSubmatch(l)
		if k == nil || i+1 == len(lines) {
			out = append(out, l)
			continue
		}
		m := overrideToken.FindStringSubmatch(lines[i+1])
		if m == nil {
			out = append(out, l)
			continue
		}
		indent, key := k[1], k[2]
		if len(m[1]) != len(indent)+2 {
			return "", fmt.Errorf("token %s is not under %s", m[2], key)
		}
		expr, ok := p.block[m[2]]
		if !ok {
			return "", fmt.Errorf("unknown token %s", m[2])
		}
		set := fmt.Sprintf(`{{ with %s }}%s%s:{{ toYaml . | nindent %d }}{{ "\n" }}`, expr, indent, key, len(indent)+2)
		if m[3] != "" {
			set = fmt.Sprintf(`{{ with %s }}%s%s: {{ . | quote }}{{ "\n" }}`, expr, indent, key)
		}
		i++
		// The same two lines with a default and without one, so that the
		// variants of an object that has it only in some share them.
		out = append(out, set+"{{ else }}"+noNewline+unguarded)
		switch rest := m[4]; {
		case rest == "null":
			// Nothing by default.
		case rest != "":
			out = append(out, indent+key+": "+rest)
		default:
			// The default's lines: those below the token, or its list's
			// items beside it, moved up to the key.
			out = append(out, indent+key+":")
			inner := len(m[1])
			for i+1 < len(lines) {
				next := lines[i+1]
				n := len(next) - len(strings.TrimLeft(next, " "))
				if next == "" || n < inner || (n == inner && !strings.HasPrefix(next[n:], "- ")) {
					break
				}
				out = append(out, next[2:])
				i++
			}
		}
		out = append(out, "{{ end }}"+noNewline+unguarded)
	}
	return strings.Join(out, "\n"), nil
}
