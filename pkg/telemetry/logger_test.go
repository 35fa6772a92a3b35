package telemetry

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"io"
	"strings"
	"testing"
	"time"
)

// fluxLogEntry is what `flux logs` (flux2 v2.7, cmd/flux/logs.go,
// ControllerLogEntry) decodes from each line; a line it cannot decode
// stops it.
type fluxLogEntry struct {
	Timestamp      string `json:"ts"`
	Level          string `json:"level"`
	Message        string `json:"msg"`
	Error          string `json:"error,omitempty"`
	Logger         string `json:"logger"`
	Kind           string `json:"reconciler kind,omitempty"`
	ControllerKind string `json:"controllerKind,omitempty"`
	Name           string `json:"name,omitempty"`
	Namespace      string `json:"namespace,omitempty"`
}

// TestJSONLogFluxKeys: the JSON format writes Flux's keys and forms, so
// that `flux logs` prints and filters Headwater's lines.
func TestJSONLogFluxKeys(t *testing.T) {
	var buf bytes.Buffer
	o := Options{LogLevel: "trace", LogFormat: "json"}
	log := o.newLogger(&buf, "watcher").WithName("results")
	log.Info("stored artifact", "controllerKind", "GitRepository", "name", "podinfo", "namespace", "flux-system")
	log.V(1).Info("debugging")
	log.V(2).Info("tracing")
	log.Error(errors.New("boom"), "reconcile failed")

	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	want := []fluxLogEntry{
		{Level: "info", Message: "stored artifact", Logger: "results", ControllerKind: "GitRepository", Name: "podinfo", Namespace: "flux-system"},
		{Level: "debug", Message: "debugging", Logger: "results"},
		{Level: "trace", Message: "tracing", Logger: "results"},
		{Level: "error", Message: "reconcile failed", Logger: "results", Error: "boom"},
	}
	if len(lines) != len(want) {
		t.Fatalf("%d lines, want %d:\n%s", len(lines), len(want), buf.String())
	}
	for i, line := range lines {
		var e fluxLogEntry
		dec := json.NewDecoder(strings.NewReader(line))
		if err := dec.Decode(&e); err != nil {
			t.Fatalf("line %d does not decode as flux logs reads it: %v\n%s", i, err, line)
		}
		if _, err := time.Parse(fluxTimeFormat, e.Timestamp); err != nil {
			t.Errorf("line %d: ts %q is not ISO 8601 as Flux's: %v", i, e.Timestamp, err)
		}
		e.Timestamp = ""
		if e != want[i] {
			t.Errorf("line %d = %+v, want %+v", i, e, want[i])
		}
		var raw map[string]any
		_ = json.Unmarshal([]byte(line), &raw)
		for _, k := range []string{"time", "err"} {
			if _, ok := raw[k]; ok {
				t.Errorf("line %d has slog's key %q: %s", i, k, line)
			}
		}
	}
}

// TestLogLevelFiltering: each level shows what Flux's shows.
func TestLogLevelFiltering(t *testing.T) {
	tests := []struct {
		level string
		want  []string
	}{
		{"error", []string{"e"}},
		{"info", []string{"i", "e"}},
		{"debug", []string{"i", "d", "e"}},
		{"trace", []string{"i", "d", "t", "e"}},
		{"DEBUG", []string{"i", "d", "e"}},
	}
	for _, tt := range tests {
		t.Run(tt.level, func(t *testing.T) {
			var buf bytes.Buffer
			o := Options{LogLevel: tt.level, LogFormat: "json"}
			log := o.newLogger(&buf, "t")
			log.Info("i")
			log.V(1).Info("d")
			log.V(2).Info("t")
			log.V(3).Info("x")
			log.Error(nil, "e")
			var got []string
			for _, line := range strings.Split(strings.TrimSpace(buf.String()), "\n") {
				var e fluxLogEntry
				if err := json.Unmarshal([]byte(line), &e); err != nil {
					t.Fatal(err)
				}
				got = append(got, e.Message)
			}
			if strings.Join(got, ",") != strings.Join(tt.want, ",") {
				t.Errorf("logged %v, want %v", got, tt.want)
			}
		})
	}
}

// TestLogFlags: good values parse (Flux's console among them); a bad
// -log-level or -log-format is an error naming the flag, never a silent
// default.
func TestLogFlags(t *testing.T) {
	tests := []struct {
		args       []string
		wantErr    string
		wantLevel  string
		wantFormat string
	}{
		{args: nil, wantLevel: "info", wantFormat: "json"},
		{args: []string{"--log-level=trace", "--log-format=console"}, wantLevel: "trace", wantFormat: "console"},
		{args: []string{"-log-level", "Debug", "-log-format", "TEXT"}, wantLevel: "debug", wantFormat: "text"},
		{args: []string{"-log-level=verbose"}, wantErr: "-log-level"},
		{args: []string{"-log-level="}, wantErr: "-log-level"},
		{args: []string{"-log-format=yaml"}, wantErr: "-log-format"},
		{args: []string{"--log-format=logfmt"}, wantErr: "-log-format"},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			var o Options
			fs := flag.NewFlagSet("t", flag.ContinueOnError)
			fs.SetOutput(io.Discard)
			o.BindFlags(fs, ":0")
			err := fs.Parse(tt.args)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("error %v, want one naming %s", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if o.LogLevel != tt.wantLevel || o.LogFormat != tt.wantFormat {
				t.Errorf("level %q format %q, want %q %q", o.LogLevel, o.LogFormat, tt.wantLevel, tt.wantFormat)
			}
			if err := o.Validate(); err != nil {
				t.Errorf("Validate: %v", err)
			}
		})
	}
	if err := (&Options{LogLevel: "loud", LogFormat: "json"}).Validate(); err == nil {
		t.Error("Validate accepts log level loud")
	}
}

// TestTextLogLevels: the text format names levels as the JSON format.
func TestTextLogLevels(t *testing.T) {
	var buf bytes.Buffer
	o := Options{LogLevel: "trace", LogFormat: "console"}
	log := o.newLogger(&buf, "t")
	log.V(1).Info("d")
	log.V(2).Info("t")
	for _, want := range []string{"level=debug msg=d", "level=trace msg=t"} {
		if !strings.Contains(buf.String(), want) {
			t.Errorf("text output lacks %q:\n%s", want, buf.String())
		}
	}
}
