package compose

import (
	"errors"
	"fmt"
	"maps"
	"path"
	"regexp"
	"slices"
	"strings"

	swv1beta1 "github.com/fluxcd/source-watcher/api/v2/v1beta1"
	"k8s.io/apimachinery/pkg/util/validation"
)

// Pattern is a generator's spec.pathPattern, parsed: "@<alias>/<pattern>",
// where each "{name}" captures one path segment (or part of one) of a
// directory of the source's tree. With a pattern, spec.artifacts are
// templates: each directory that matches makes one output per template,
// "{name}" in its name, copy from and copy to replaced by what the
// directory's path had there (lowercased in the name, as written in the
// paths), and the captures become the ExternalArtifact's labels
// (lowercased), as Flux's source-watcher does.
type Pattern struct {
	// Alias is the source whose tree is searched.
	Alias string
	raw   string
	re    *regexp.Regexp
	// captures are the capture names, in the pattern's order.
	captures []string
}

// captureName is what a capture's name must be: a CEL variable name, as
// source-watcher requires.
var captureName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// placeholder finds "{name}" in a template, and the Go-template form
// "{{ .name }}" that source-watcher's tests also use; "{" followed by
// anything else (a glob's alternation, say) is left as it is.
var placeholder = regexp.MustCompile(`\{\{\s*\.([A-Za-z_][A-Za-z0-9_]*)\s*\}\}|\{([A-Za-z_][A-Za-z0-9_]*)\}`)

// ParsePattern parses spec.pathPattern. Its error, in source-watcher's
// words where it has them, wraps ErrInvalid.
func ParsePattern(s string) (*Pattern, error) {
	alias, rest, ok := splitRef(s)
	if !ok {
		return nil, fmt.Errorf("%w: invalid pathPattern format: %s (want @<alias>/<pattern>)", ErrInvalid, s)
	}
	p := &Pattern{Alias: alias, raw: s}
	rest = strings.TrimSuffix(rest, "/")
	var re strings.Builder
	re.WriteString("^")
	seen := map[string]bool{}
	for i := 0; i < len(rest); i++ {
		switch rest[i] {
		case '{':
			end := strings.IndexByte(rest[i+1:], '}')
			if end < 0 {
				return nil, fmt.Errorf("%w: pathPattern %q: invalid capture starting at offset %d: missing closing brace", ErrInvalid, s, i)
			}
			name := rest[i+1 : i+1+end]
			switch {
			case name == "":
				return nil, fmt.Errorf("%w: pathPattern %q: empty capture variable", ErrInvalid, s)
			case !captureName.MatchString(name):
				return nil, fmt.Errorf("%w: pathPattern %q: capture variable %q must match [A-Za-z_][A-Za-z0-9_]*", ErrInvalid, s, name)
			case seen[name]:
				return nil, fmt.Errorf("%w: pathPattern %q: duplicate capture variable %q", ErrInvalid, s, name)
			}
			if errs := validation.IsQualifiedName(name); len(errs) > 0 {
				return nil, fmt.Errorf("%w: pathPattern %q: capture variable %q is not a valid Kubernetes label key: %s",
					ErrInvalid, s, name, strings.Join(errs, "; "))
			}
			seen[name] = true
			p.captures = append(p.captures, name)
			fmt.Fprintf(&re, "(?P<%s>[^/]+)", name)
			i += end + 1
		case '}':
			return nil, fmt.Errorf("%w: pathPattern %q: invalid capture ending at offset %d: missing opening brace", ErrInvalid, s, i)
		default:
			re.WriteString(regexp.QuoteMeta(rest[i : i+1]))
		}
	}
	re.WriteString("$")
	if _, _, err := cleanRel(rest); err != nil || rest == "" {
		return nil, fmt.Errorf("%w: pathPattern %q: %w", ErrInvalid, s, cmpErr(err, errors.New("names no directory below the source's root")))
	}
	var err error
	if p.re, err = regexp.Compile(re.String()); err != nil {
		return nil, fmt.Errorf("%w: pathPattern %q: %w", ErrInvalid, s, err)
	}
	return p, nil
}

func cmpErr(err, otherwise error) error {
	if err != nil {
		return err
	}
	return otherwise
}

// String returns the pattern as the spec has it.
func (p *Pattern) String() string { return p.raw }

// render replaces the placeholders of s by values; a placeholder naming
// no capture is an error.
func render(s string, values map[string]string) (string, error) {
	var bad string
	out := placeholder.ReplaceAllStringFunc(s, func(m string) string {
		sub := placeholder.FindStringSubmatch(m)
		name := sub[1] + sub[2]
		v, ok := values[name]
		if !ok && bad == "" {
			bad = name
		}
		return v
	})
	if bad != "" {
		return "", fmt.Errorf("placeholder {%s} is not a capture of the pathPattern", bad)
	}
	return out, nil
}

// sample is every capture set to value: the templates rendered with it
// are checked before any content is read.
func (p *Pattern) sample(value string) map[string]string {
	m := map[string]string{}
	for _, c := range p.captures {
		m[c] = value
	}
	return m
}

// validateTemplates checks spec.artifacts as templates of p: every
// placeholder names a capture, and the artifacts rendered with a sample
// value are valid (names, copy operations).
func (p *Pattern) validateTemplates(artifacts []swv1beta1.OutputArtifact, aliases map[string]bool) error {
	names := map[string]bool{}
	for _, a := range artifacts {
		if names[a.Name] {
			return fmt.Errorf("%w: two artifacts are named %q", ErrInvalid, a.Name)
		}
		names[a.Name] = true
		r, err := p.renderArtifact(a, p.sample("x"), p.sample("x"))
		if err != nil {
			return fmt.Errorf("%w: artifact %q: %w", ErrInvalid, a.Name, err)
		}
		if err := checkName(r.Name); err != nil {
			return fmt.Errorf("%w: artifact %q: rendered %q: %w", ErrInvalid, a.Name, r.Name, err)
		}
		if err := validateArtifact(r, aliases); err != nil {
			return err
		}
	}
	return nil
}

// renderArtifact renders one template: its name with names, its copy
// operations' from and to with paths.
func (p *Pattern) renderArtifact(a swv1beta1.OutputArtifact, names, paths map[string]string) (swv1beta1.OutputArtifact, error) {
	out := a
	var err error
	if out.Name, err = render(a.Name, names); err != nil {
		return out, fmt.Errorf("name: %w", err)
	}
	out.Copy = make([]swv1beta1.CopyOperation, len(a.Copy))
	for i, c := range a.Copy {
		out.Copy[i] = c
		if out.Copy[i].From, err = render(c.From, paths); err != nil {
			return out, fmt.Errorf("copy[%d] from: %w", i, err)
		}
		if out.Copy[i].To, err = render(c.To, paths); err != nil {
			return out, fmt.Errorf("copy[%d] to: %w", i, err)
		}
	}
	return out, nil
}

// Output is one output a pattern made: the template rendered for one
// matching directory, and that directory's captures as labels.
type Output struct {
	swv1beta1.OutputArtifact
	// Labels are the captures, lowercased.
	Labels map[string]string
}

// Expand makes the outputs of the templates for every directory of dirs
// (slash paths below the source's root) that the pattern matches, in the
// order of dirs then of the templates. A captured value that is not a
// valid label value once lowercased, a rendered name that is not a valid
// object name, two directories making one name, and no directory matching
// at all are errors wrapping ErrBuild: they depend on the source's
// content.
func (p *Pattern) Expand(dirs []string, artifacts []swv1beta1.OutputArtifact) ([]Output, error) {
	var outs []Output
	from := map[string]string{}
	subexp := p.re.SubexpNames()
	matched := 0
	for _, dir := range dirs {
		m := p.re.FindStringSubmatch(dir)
		if m == nil {
			continue
		}
		matched++
		raw, lower := map[string]string{}, map[string]string{}
		for i, name := range subexp {
			if i == 0 || name == "" {
				continue
			}
			raw[name] = m[i]
			lower[name] = strings.ToLower(m[i])
			if errs := validation.IsValidLabelValue(lower[name]); len(errs) > 0 {
				return nil, fmt.Errorf("%w: pathPattern %q: captured value %q for variable %q is not a valid Kubernetes label value: %s",
					ErrBuild, p.raw, lower[name], name, strings.Join(errs, "; "))
			}
		}
		for _, a := range artifacts {
			r, err := p.renderArtifact(a, lower, raw)
			if err != nil {
				return nil, fmt.Errorf("%w: pathPattern %q: failed to render artifact %s for match %s: %w", ErrInvalid, p.raw, a.Name, dir, err)
			}
			if errs := validation.IsDNS1123Subdomain(r.Name); len(errs) > 0 {
				return nil, fmt.Errorf("%w: pathPattern %q: rendered artifact name %q is not a valid Kubernetes object name: %s",
					ErrBuild, p.raw, r.Name, strings.Join(errs, "; "))
			}
			if prev, ok := from[r.Name]; ok {
				return nil, fmt.Errorf("%w: pathPattern %q: directories %q and %q both resolve to artifact name %q",
					ErrBuild, p.raw, prev, dir, r.Name)
			}
			from[r.Name] = dir
			outs = append(outs, Output{OutputArtifact: r, Labels: maps.Clone(lower)})
		}
	}
	if matched == 0 {
		return nil, fmt.Errorf("%w: %w", ErrBuild, &NoMatchError{Pattern: p.raw, Alias: p.Alias})
	}
	return outs, nil
}

// NoMatchError is the error of a pattern that matches no directory of its
// source's tree. Nothing is stored for it: the outputs published before
// stay.
type NoMatchError struct {
	Pattern, Alias string
}

func (e *NoMatchError) Error() string {
	return fmt.Sprintf("pathPattern %q matches no directory in source %q: create a matching directory in the source, "+
		"or correct spec.pathPattern (each {capture} matches one directory name, and the pattern is matched against directories from the source's root)",
		e.Pattern, e.Alias)
}

// Dirs collects the directories of a source's tree as it is unpacked:
// directory entries, and the directories above every entry.
type Dirs map[string]bool

// Record wraps keep (nil keeps everything) so that every entry it is
// asked about is recorded.
func (d Dirs) Record(keep func(name string, isDir bool) bool) func(name string, isDir bool) bool {
	return func(name string, isDir bool) bool {
		dir := name
		if !isDir {
			dir = path.Dir(name)
		}
		for dir != "." && dir != "" && dir != "/" && !d[dir] {
			d[dir] = true
			dir = path.Dir(dir)
		}
		return keep == nil || keep(name, isDir)
	}
}

// Sorted returns the directories in lexical order.
func (d Dirs) Sorted() []string { return slices.Sorted(maps.Keys(d)) }
