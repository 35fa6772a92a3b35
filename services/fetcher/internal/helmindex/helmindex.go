// Package helmindex reads Helm repository indexes as streams: Check tells
// whether a stream is a Helm index (it has apiVersion and entries, and no
// YAML aliases, so no alias bomb) and Versions reads one chart's entry,
// without ever holding the whole index in memory. A 48 MiB index costs a
// line buffer to check, and one chart's entry to look up.
//
// Indexes come in two shapes and both are read: YAML in block style, as
// `helm repo index`, chart-releaser and ChartMuseum write it (the top-level
// keys and the chart names under entries are found by their indentation),
// and JSON (YAML's flow style, as Flux stores indexes), read with a
// streaming JSON tokenizer.
package helmindex

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"

	"sigs.k8s.io/yaml"
)

// MaxLineSize bounds one line of a YAML index (a JSON index may be one
// line of any length: it is tokenized, not split into lines).
const MaxLineSize = 1 << 20

// Errors Check returns, wrapped with details.
var (
	// ErrNotIndex: the stream is not a Helm repository index.
	ErrNotIndex = errors.New("not a Helm repository index")
	// ErrAlias: the index uses YAML aliases. No tool writes them into an
	// index, and expanding them is how an alias bomb takes a parser's
	// memory, so they are refused.
	ErrAlias = errors.New("YAML aliases are not allowed in a Helm repository index")
)

// Check reads r to its end and returns nil if it is a Helm repository
// index: a mapping with the keys apiVersion and entries. Its memory is a
// line of the index (at most MaxLineSize), whatever the index's size.
func Check(r io.Reader) error {
	br := bufio.NewReaderSize(r, 64<<10)
	first, err := firstByte(br)
	if err != nil {
		return err
	}
	var keys map[string]bool
	if first == '{' {
		keys, err = jsonKeys(br)
	} else {
		keys, err = yamlKeys(br)
	}
	if err != nil {
		return err
	}
	switch {
	case !keys["apiVersion"]:
		return fmt.Errorf("%w: no API version specified", ErrNotIndex)
	case !keys["entries"]:
		return fmt.Errorf("%w: no entries", ErrNotIndex)
	}
	return nil
}

// Versions returns the entries of the chart named name in the index r,
// in the index's order, or nil when the index has none. Only that chart's
// entry is held in memory. The index should have passed Check.
func Versions(r io.Reader, name string) (ChartVersions, error) {
	br := bufio.NewReaderSize(r, 64<<10)
	first, err := firstByte(br)
	if err != nil {
		return nil, err
	}
	if first == '{' {
		return jsonVersions(br, name)
	}
	return yamlVersions(br, name)
}

// firstByte peeks at the first byte of the stream that is not white space
// or part of a comment line.
func firstByte(br *bufio.Reader) (byte, error) {
	comment := false
	for {
		b, err := br.ReadByte()
		if err == io.EOF {
			return 0, fmt.Errorf("%w: the index is empty", ErrNotIndex)
		}
		if err != nil {
			return 0, err
		}
		switch {
		case comment:
			comment = b != '\n'
			continue
		case b == '#':
			comment = true
			continue
		case b == ' ' || b == '\t' || b == '\r' || b == '\n' || b == 0xef || b == 0xbb || b == 0xbf: // BOM
			continue
		}
		return b, br.UnreadByte()
	}
}

// jsonKeys returns the top-level keys of a JSON object, skipping values
// token by token.
func jsonKeys(r io.Reader) (map[string]bool, error) {
	dec := json.NewDecoder(r)
	if _, err := dec.Token(); err != nil { // '{', as firstByte saw
		return nil, fmt.Errorf("%w: invalid JSON: %w", ErrNotIndex, err)
	}
	keys := map[string]bool{}
	for dec.More() {
		k, err := dec.Token()
		if err != nil {
			return nil, fmt.Errorf("%w: invalid JSON: %w", ErrNotIndex, err)
		}
		key, _ := k.(string)
		keys[key] = true
		if err := skipJSON(dec); err != nil {
			return nil, err
		}
	}
	if _, err := dec.Token(); err != nil {
		return nil, fmt.Errorf("%w: invalid JSON: %w", ErrNotIndex, err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, fmt.Errorf("%w: data after the index's JSON object", ErrNotIndex)
	}
	return keys, nil
}

// skipJSON reads one value.
func skipJSON(dec *json.Decoder) error {
	depth := 0
	for {
		t, err := dec.Token()
		if err != nil {
			return fmt.Errorf("%w: invalid JSON: %w", ErrNotIndex, err)
		}
		if d, ok := t.(json.Delim); ok {
			if d == '{' || d == '[' {
				depth++
			} else {
				depth--
			}
		}
		if depth == 0 {
			return nil
		}
	}
}

// jsonVersions finds entries.<name> in a JSON index and decodes only it.
func jsonVersions(r io.Reader, name string) (ChartVersions, error) {
	dec := json.NewDecoder(r)
	if _, err := dec.Token(); err != nil {
		return nil, fmt.Errorf("%w: invalid JSON: %w", ErrNotIndex, err)
	}
	for dec.More() {
		k, err := dec.Token()
		if err != nil {
			return nil, fmt.Errorf("%w: invalid JSON: %w", ErrNotIndex, err)
		}
		if k != "entries" {
			if err := skipJSON(dec); err != nil {
				return nil, err
			}
			continue
		}
		if t, err := dec.Token(); err != nil || t != json.Delim('{') {
			return nil, fmt.Errorf("%w: entries is not an object", ErrNotIndex)
		}
		for dec.More() {
			k, err := dec.Token()
			if err != nil {
				return nil, fmt.Errorf("%w: invalid JSON: %w", ErrNotIndex, err)
			}
			if k != name {
				if err := skipJSON(dec); err != nil {
					return nil, err
				}
				continue
			}
			var versions ChartVersions
			if err := dec.Decode(&versions); err != nil {
				return nil, fmt.Errorf("%w: entry of chart '%s': %w", ErrNotIndex, name, err)
			}
			return versions, nil
		}
		return nil, nil
	}
	return nil, nil
}

// line is one line of a YAML index, without its line break.
type line struct {
	text   []byte
	indent int
}

// blank reports a line with nothing but white space or a comment.
func (l line) blank() bool {
	t := bytes.TrimSpace(l.text)
	return len(t) == 0 || t[0] == '#'
}

// lines splits a YAML stream into lines of at most MaxLineSize.
type lines struct {
	br  *bufio.Reader
	buf []byte
	n   int // line number, from 1
}

// next returns the next line, io.EOF after the last.
func (ls *lines) next() (line, error) {
	ls.buf = ls.buf[:0]
	for {
		chunk, err := ls.br.ReadSlice('\n')
		ls.buf = append(ls.buf, chunk...)
		if len(ls.buf) > MaxLineSize {
			return line{}, fmt.Errorf("%w: line %d is longer than %d bytes", ErrNotIndex, ls.n+1, MaxLineSize)
		}
		if errors.Is(err, bufio.ErrBufferFull) {
			continue
		}
		if err == io.EOF && len(ls.buf) > 0 {
			err = nil
		}
		if err != nil {
			return line{}, err
		}
		break
	}
	ls.n++
	text := bytes.TrimRight(ls.buf, "\r\n")
	indent := 0
	for indent < len(text) && text[indent] == ' ' {
		indent++
	}
	return line{text: text, indent: indent}, nil
}

// yamlKeys reads a block-style YAML document and returns its top-level
// keys. It refuses aliases anywhere outside block scalars and quoted
// strings, a second document, and a top level that is not a mapping.
func yamlKeys(r *bufio.Reader) (map[string]bool, error) {
	ls := &lines{br: r}
	keys := map[string]bool{}
	var sc scanner
	for {
		l, err := ls.next()
		if err == io.EOF {
			return keys, nil
		}
		if err != nil {
			return nil, err
		}
		if sc.inBlockScalar(l) || l.blank() && !sc.quoted() {
			continue
		}
		if l.indent == 0 && !sc.quoted() {
			switch t := string(l.text); {
			case t == "---" || strings.HasPrefix(t, "--- "):
				if len(keys) > 0 {
					return nil, fmt.Errorf("%w: more than one YAML document", ErrNotIndex)
				}
				continue
			case t == "...":
				continue
			}
			key, ok := mappingKey(l.text)
			if !ok {
				return nil, fmt.Errorf("%w: line %d: the top level is not a mapping", ErrNotIndex, ls.n)
			}
			keys[key] = true
		}
		if err := sc.scan(l); err != nil {
			return nil, fmt.Errorf("line %d: %w", ls.n, err)
		}
	}
}

// yamlVersions finds entries.<name> in a block-style YAML index by
// indentation and unmarshals only its lines.
func yamlVersions(r *bufio.Reader, name string) (ChartVersions, error) {
	ls := &lines{br: r}
	inEntries, childIndent := false, -1
	var block bytes.Buffer
	capturing := false
	var sc scanner
	for {
		l, err := ls.next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, err
		}
		if sc.inBlockScalar(l) || sc.quoted() || l.blank() {
			if capturing {
				block.Write(l.text)
				block.WriteByte('\n')
			}
			if !l.blank() {
				if err := sc.scan(l); err != nil {
					return nil, err
				}
			}
			continue
		}
		if err := sc.scan(l); err != nil {
			return nil, err
		}
		if l.indent == 0 {
			if capturing {
				break
			}
			key, _ := mappingKey(l.text)
			inEntries = key == "entries"
			if inEntries {
				if v := strings.TrimSpace(afterKey(l.text)); v != "" && v[0] == '{' {
					// entries in flow style on one line.
					var entries map[string]ChartVersions
					if err := yaml.Unmarshal([]byte(v), &entries); err != nil {
						return nil, fmt.Errorf("%w: entries: %w", ErrNotIndex, err)
					}
					return entries[name], nil
				}
			}
			continue
		}
		if !inEntries {
			continue
		}
		if childIndent < 0 {
			childIndent = l.indent
		}
		if l.indent == childIndent && !isSequenceItem(l.text[l.indent:]) {
			if capturing {
				break
			}
			if key, ok := mappingKey(l.text[l.indent:]); ok && key == name {
				capturing = true
			}
		}
		if capturing {
			block.Write(l.text)
			block.WriteByte('\n')
		}
	}
	if !capturing {
		return nil, nil
	}
	var entry map[string]ChartVersions
	if err := yaml.Unmarshal(block.Bytes(), &entry); err != nil {
		return nil, fmt.Errorf("%w: entry of chart '%s': %w", ErrNotIndex, name, err)
	}
	return entry[name], nil
}

func isSequenceItem(t []byte) bool {
	return len(t) > 0 && t[0] == '-' && (len(t) == 1 || t[1] == ' ')
}

// mappingKey returns the key of a line "key: value" or "key:", plain or
// quoted.
func mappingKey(t []byte) (string, bool) {
	s := string(t)
	if s == "" {
		return "", false
	}
	if q := s[0]; q == '"' || q == '\'' {
		end := strings.IndexByte(s[1:], q)
		if end < 0 || !strings.HasPrefix(s[end+2:], ":") {
			return "", false
		}
		return s[1 : end+1], true
	}
	if strings.ContainsRune("-[]{}#&*!|>%@`,?", rune(s[0])) {
		return "", false
	}
	i := strings.Index(s, ":")
	for i >= 0 && i+1 < len(s) && s[i+1] != ' ' {
		j := strings.Index(s[i+1:], ":")
		if j < 0 {
			return "", false
		}
		i += 1 + j
	}
	if i < 0 {
		return "", false
	}
	return strings.TrimSpace(s[:i]), true
}

// afterKey returns what follows "key:" on a line.
func afterKey(t []byte) string {
	s := string(t)
	if i := strings.Index(s, ": "); i >= 0 {
		return s[i+2:]
	}
	return ""
}

// scanner follows the parts of YAML that decide whether a '*' is an
// alias: quoted strings (which may span lines) and block scalars.
type scanner struct {
	quote       byte // the open quote, 0 outside quoted strings
	blockIndent int  // the indentation of the line that opened a block scalar, -1 for none
	blockOpen   bool
}

func (s *scanner) quoted() bool { return s.quote != 0 }

// inBlockScalar reports whether l is content of a block scalar ('|' or
// '>') opened by an earlier line: more indented than that line, or blank.
func (s *scanner) inBlockScalar(l line) bool {
	if !s.blockOpen {
		return false
	}
	if l.blank() && len(bytes.TrimSpace(l.text)) == 0 || l.indent > s.blockIndent {
		return true
	}
	s.blockOpen = false
	return false
}

// scan reads a line's tokens: it fails on an alias (a '*' where a node
// begins), and notes quoted strings and block scalars left open.
func (s *scanner) scan(l line) error {
	t := l.text
	nodeStart := true // a node may begin here
	for i := 0; i < len(t); i++ {
		c := t[i]
		if s.quote != 0 {
			switch {
			case s.quote == '\'' && c == '\'' && i+1 < len(t) && t[i+1] == '\'':
				i++
			case s.quote == '"' && c == '\\':
				i++
			case c == s.quote:
				s.quote = 0
				nodeStart = false
			}
			continue
		}
		switch {
		case c == ' ' || c == '\t':
			continue
		case c == '#' && (i == 0 || t[i-1] == ' ' || t[i-1] == '\t'):
			return nil
		case nodeStart && (c == '"' || c == '\''):
			s.quote = c
			continue
		case nodeStart && c == '*':
			return ErrAlias
		case nodeStart && c == '&':
			// An anchor: skip its name; the node follows.
			for i+1 < len(t) && t[i+1] != ' ' {
				i++
			}
			continue
		case nodeStart && (c == '|' || c == '>'):
			rest := strings.TrimSpace(string(t[i+1:]))
			if rest == "" || strings.Trim(rest, "+-0123456789") == "" || strings.HasPrefix(strings.TrimLeft(rest, "+-0123456789"), " #") {
				s.blockOpen, s.blockIndent = true, l.indent
				return nil
			}
		case c == '-' && nodeStart && (i+1 == len(t) || t[i+1] == ' '):
			continue // a sequence item: a node begins after it
		case c == '[' || c == '{' || c == ',':
			nodeStart = true
			continue
		case c == ':' && (i+1 == len(t) || t[i+1] == ' ' || t[i+1] == ',' || t[i+1] == ']' || t[i+1] == '}'):
			nodeStart = true
			continue
		case c == '?' && nodeStart && (i+1 == len(t) || t[i+1] == ' '):
			continue
		}
		nodeStart = false
	}
	return nil
}
