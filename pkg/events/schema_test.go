package events

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"go/ast"
	"go/parser"
	gotoken "go/token"
	"maps"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/santhosh-tekuri/jsonschema/v6"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// update rewrites the generated JSON Schemas (docs/schemas) and the wire
// format golden files (testdata/wire) instead of comparing with them:
//
//	go test ./events -run 'TestSchemas|TestWireFormat' -update
var update = flag.Bool("update", false, "rewrite docs/schemas and testdata/wire from the Go structs")

// schemaDir is where the JSON Schema of each event type's data is kept,
// one file per type: docs/schemas/<type>.json.
const schemaDir = "../../docs/schemas"

// schemaDialect is the JSON Schema version the generated schemas use.
const schemaDialect = "https://json-schema.org/draft/2020-12/schema"

// goDocs holds the doc comments of this package's declarations, read from
// its source, so the schemas describe each field in the words of the code.
type goDocs struct {
	// types maps a type name to its doc; fields "Type.Field" to the field's.
	types, fields map[string]string
	// events maps an event type string ("io.headwater...v1") to the doc of
	// the constant that names it.
	events map[string]string
}

func readGoDocs(t *testing.T) goDocs {
	t.Helper()
	fset := gotoken.NewFileSet()
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	d := goDocs{types: map[string]string{}, fields: map[string]string{}, events: map[string]string{}}
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, parser.ParseComments)
		if err != nil {
			t.Fatal(err)
		}
		for _, decl := range f.Decls {
			g, ok := decl.(*ast.GenDecl)
			if !ok {
				continue
			}
			for _, spec := range g.Specs {
				switch s := spec.(type) {
				case *ast.TypeSpec:
					doc := s.Doc
					if doc == nil {
						doc = g.Doc
					}
					d.types[s.Name.Name] = docText(doc)
					st, ok := s.Type.(*ast.StructType)
					if !ok {
						continue
					}
					for _, field := range st.Fields.List {
						for _, n := range field.Names {
							d.fields[s.Name.Name+"."+n.Name] = docText(field.Doc)
						}
					}
				case *ast.ValueSpec:
					for i, n := range s.Names {
						if !strings.HasPrefix(n.Name, "Type") || i >= len(s.Values) {
							continue
						}
						lit, ok := s.Values[i].(*ast.BasicLit)
						if !ok || lit.Kind != gotoken.STRING {
							continue
						}
						v, err := strconv.Unquote(lit.Value)
						if err != nil {
							t.Fatal(err)
						}
						d.events[v] = docText(s.Doc)
					}
				}
			}
		}
	}
	return d
}

// docText is a comment as one paragraph.
func docText(g *ast.CommentGroup) string {
	if g == nil {
		return ""
	}
	return strings.Join(strings.Fields(g.Text()), " ")
}

// schemaGen builds a JSON Schema from Go types the way encoding/json
// encodes them: a struct is an object whose properties are its JSON
// fields, required unless omitempty; a pointer, slice or map that may be
// encoded as null says so.
type schemaGen struct {
	docs goDocs
	defs map[string]any
}

var (
	timeType       = reflect.TypeFor[time.Time]()
	metaTimeType   = reflect.TypeFor[metav1.Time]()
	durationType   = reflect.TypeFor[metav1.Duration]()
	rawMessageType = reflect.TypeFor[json.RawMessage]()
	marshaler      = reflect.TypeFor[json.Marshaler]()
)

// defName names a struct's definition: bare for this package's types,
// qualified by the last element of the package path otherwise
// ("meta.Artifact", "v1.GitRepositorySpec").
func defName(t reflect.Type) string {
	if t.PkgPath() == reflect.TypeFor[Outcome]().PkgPath() {
		return t.Name()
	}
	return filepath.Base(t.PkgPath()) + "." + t.Name()
}

func (g *schemaGen) schema(t reflect.Type) (map[string]any, error) {
	switch t {
	case timeType, metaTimeType:
		return map[string]any{"type": "string", "format": "date-time"}, nil
	case durationType:
		return map[string]any{"type": "string", "description": "A Go duration, e.g. \"1m30s\"."}, nil
	case rawMessageType:
		return map[string]any{"description": "Any JSON value, carried as it is."}, nil
	}
	if t.Kind() == reflect.Pointer {
		return g.schema(t.Elem())
	}
	if t.Implements(marshaler) || reflect.PointerTo(t).Implements(marshaler) {
		return nil, fmt.Errorf("%s has its own JSON encoding: describe it in schemaGen.schema", t)
	}
	switch t.Kind() {
	case reflect.String:
		return map[string]any{"type": "string"}, nil
	case reflect.Bool:
		return map[string]any{"type": "boolean"}, nil
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return map[string]any{"type": "integer"}, nil
	case reflect.Float32, reflect.Float64:
		return map[string]any{"type": "number"}, nil
	case reflect.Slice, reflect.Array:
		items, err := g.schema(t.Elem())
		if err != nil {
			return nil, err
		}
		return map[string]any{"type": "array", "items": items}, nil
	case reflect.Map:
		if t.Key().Kind() != reflect.String {
			return nil, fmt.Errorf("%s: map keys must be strings", t)
		}
		values, err := g.schema(t.Elem())
		if err != nil {
			return nil, err
		}
		return map[string]any{"type": "object", "additionalProperties": values}, nil
	case reflect.Interface:
		return map[string]any{}, nil
	case reflect.Struct:
		name := defName(t)
		ref := map[string]any{"$ref": "#/$defs/" + name}
		if _, ok := g.defs[name]; ok {
			return ref, nil
		}
		g.defs[name] = nil // placeholder against recursion
		def, err := g.object(t)
		if err != nil {
			return nil, err
		}
		if doc := g.docs.types[t.Name()]; doc != "" && name == t.Name() {
			def["description"] = doc
		}
		g.defs[name] = def
		return ref, nil
	}
	return nil, fmt.Errorf("%s: no JSON Schema for kind %s", t, t.Kind())
}

// object is the schema of a struct, its embedded structs' fields inlined as
// encoding/json does. Unknown properties are allowed: adding an optional
// field is a compatible change (docs/events.md).
func (g *schemaGen) object(t reflect.Type) (map[string]any, error) {
	props := map[string]any{}
	var required []string
	var add func(t reflect.Type) error
	add = func(t reflect.Type) error {
		for f := range t.Fields() {
			tag := f.Tag.Get("json")
			if tag == "-" || !f.IsExported() && !f.Anonymous {
				continue
			}
			name, opts, _ := strings.Cut(tag, ",")
			if f.Anonymous && name == "" {
				ft := f.Type
				if ft.Kind() == reflect.Pointer {
					ft = ft.Elem()
				}
				if ft.Kind() == reflect.Struct {
					if err := add(ft); err != nil {
						return err
					}
					continue
				}
			}
			if name == "" {
				name = f.Name
			}
			s, err := g.schema(f.Type)
			if err != nil {
				return fmt.Errorf("%s.%s: %w", t.Name(), f.Name, err)
			}
			omitempty := slices.Contains(strings.Split(opts, ","), "omitempty")
			switch k := f.Type.Kind(); {
			case omitempty:
			case k == reflect.Pointer || k == reflect.Slice || k == reflect.Map:
				s = map[string]any{"anyOf": []any{s, map[string]any{"type": "null"}}}
			}
			if doc := g.docs.fields[t.Name()+"."+f.Name]; doc != "" && defName(t) == t.Name() {
				if _, isRef := s["$ref"]; isRef {
					s = map[string]any{"allOf": []any{s}}
				}
				s["description"] = doc
			}
			props[name] = s
			if !omitempty {
				required = append(required, name)
			}
		}
		return nil
	}
	if err := add(t); err != nil {
		return nil, err
	}
	obj := map[string]any{"type": "object", "properties": props}
	if len(required) > 0 {
		slices.Sort(required)
		obj["required"] = required
	}
	return obj, nil
}

// generateSchema returns the JSON Schema of an event type's data.
func generateSchema(docs goDocs, eventType string) ([]byte, error) {
	g := &schemaGen{docs: docs, defs: map[string]any{}}
	root, err := g.schema(reflect.TypeOf(dataTypes[eventType]()))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", eventType, err)
	}
	s := map[string]any{
		"$schema":     schemaDialect,
		"$id":         eventType + ".json",
		"title":       "data of " + eventType,
		"description": docs.events[eventType],
		"$ref":        root["$ref"],
		"$defs":       g.defs,
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetIndent("", "  ")
	enc.SetEscapeHTML(false)
	if err := enc.Encode(s); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// compileSchema compiles a generated schema for validation.
func compileSchema(t *testing.T, eventType string, b []byte) *jsonschema.Schema {
	t.Helper()
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(b))
	if err != nil {
		t.Fatalf("%s schema: %v", eventType, err)
	}
	c := jsonschema.NewCompiler()
	c.AssertFormat()
	url := "file:///schemas/" + eventType + ".json"
	if err := c.AddResource(url, doc); err != nil {
		t.Fatalf("%s schema: %v", eventType, err)
	}
	s, err := c.Compile(url)
	if err != nil {
		t.Fatalf("%s schema: %v", eventType, err)
	}
	return s
}

// validateData checks JSON data against a compiled schema.
func validateData(t *testing.T, s *jsonschema.Schema, data []byte) error {
	t.Helper()
	v, err := jsonschema.UnmarshalJSON(bytes.NewReader(data))
	if err != nil {
		t.Fatalf("data: %v", err)
	}
	return s.Validate(v)
}

// TestSchemas keeps docs/schemas in step with the Go structs: every event
// type has a schema, generated from its data struct, and nothing else is
// there. Run with -update after changing a struct.
func TestSchemas(t *testing.T) {
	docs := readGoDocs(t)
	want := map[string][]byte{}
	for _, typ := range slices.Sorted(maps.Keys(dataTypes)) {
		if docs.events[typ] == "" {
			t.Errorf("%s: the constant naming it has no doc comment", typ)
		}
		b, err := generateSchema(docs, typ)
		if err != nil {
			t.Fatal(err)
		}
		want[typ+".json"] = b
	}
	if *update {
		if err := os.MkdirAll(schemaDir, 0o755); err != nil {
			t.Fatal(err)
		}
		old, _ := filepath.Glob(filepath.Join(schemaDir, "*.json"))
		for _, f := range old {
			if err := os.Remove(f); err != nil {
				t.Fatal(err)
			}
		}
		for name, b := range want {
			if err := os.WriteFile(filepath.Join(schemaDir, name), b, 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	have, err := filepath.Glob(filepath.Join(schemaDir, "*.json"))
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range have {
		if _, ok := want[filepath.Base(f)]; !ok {
			t.Errorf("%s is for no event type: remove it (go test ./events -run TestSchemas -update)", f)
		}
	}
	for name, b := range want {
		got, err := os.ReadFile(filepath.Join(schemaDir, name))
		if err != nil || !bytes.Equal(got, b) {
			t.Errorf("docs/schemas/%s is not generated from the Go structs: run go test ./events -run TestSchemas -update (in pkg)", name)
		}
	}
}

// TestSchemasAcceptSampleData validates every type's fully populated
// sample data against its schema, and checks that the schema rejects data
// that breaks the contract.
func TestSchemasAcceptSampleData(t *testing.T) {
	docs := readGoDocs(t)
	for typ, data := range sampleData() {
		t.Run(typ, func(t *testing.T) {
			b, err := generateSchema(docs, typ)
			if err != nil {
				t.Fatal(err)
			}
			s := compileSchema(t, typ, b)
			body, err := json.Marshal(data)
			if err != nil {
				t.Fatal(err)
			}
			if err := validateData(t, s, body); err != nil {
				t.Errorf("sample data does not match the schema: %v", err)
			}
			for _, bad := range []struct{ name, data string }{
				{"no job", `{}`},
				{"job is a string", `{"job": "x"}`},
				{"generation is a string", `{"job": {"id": "i", "requestedAt": "2026-01-02T03:04:05Z", "object": {"kind": "k", "namespace": "n", "name": "m", "uid": "u", "generation": "7"}}}`},
				{"requestedAt is no time", `{"job": {"id": "i", "requestedAt": "yesterday", "object": {"kind": "k", "namespace": "n", "name": "m", "uid": "u", "generation": 7}}}`},
			} {
				if err := validateData(t, s, []byte(bad.data)); err == nil {
					t.Errorf("%s: schema accepts %s", bad.name, bad.data)
				}
			}
		})
	}
}
