package flagenv

import (
	"flag"
	"testing"
)

func TestParse(t *testing.T) {
	tests := []struct {
		name string
		args []string
		env  map[string]string
		want string
	}{
		{name: "default", want: "d"},
		{name: "environment", env: map[string]string{"HEADWATER_NATS_URL": "e"}, want: "e"},
		{name: "flag wins", args: []string{"-nats-url=f"}, env: map[string]string{"HEADWATER_NATS_URL": "e"}, want: "f"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for k, v := range tt.env {
				t.Setenv(k, v)
			}
			fs := flag.NewFlagSet("t", flag.ContinueOnError)
			got := fs.String("nats-url", "d", "")
			if err := Parse(fs, tt.args); err != nil {
				t.Fatal(err)
			}
			if *got != tt.want {
				t.Fatalf("nats-url = %q, want %q", *got, tt.want)
			}
		})
	}
}

func TestParseBadEnvironment(t *testing.T) {
	t.Setenv("HEADWATER_CONCURRENCY", "many")
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	fs.Int("concurrency", 1, "")
	if err := Parse(fs, nil); err == nil {
		t.Fatal("want an error for a non-numeric HEADWATER_CONCURRENCY")
	}
}

func TestFromEnvCommandLineOnly(t *testing.T) {
	t.Setenv("HEADWATER_VERSION", "v0.1.0")
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	version := fs.Bool("version", false, "")
	if err := fs.Parse(nil); err != nil {
		t.Fatal(err)
	}
	if err := FromEnv(fs, "version"); err != nil || *version {
		t.Fatalf("FromEnv read a command-line-only flag from the environment: %v, version %v", err, *version)
	}
}

// aliasValue is another name of the flag "concurrency".
type aliasValue struct{ flag.Value }

func (aliasValue) AliasOf() string { return "concurrency" }

// TestFromEnvAlias: the command line's alias wins over the environment of
// its flag, and an alias is never read from the environment itself.
func TestFromEnvAlias(t *testing.T) {
	tests := []struct {
		name string
		args []string
		env  map[string]string
		want int
	}{
		{name: "alias on the command line wins", args: []string{"--concurrent=3"}, env: map[string]string{"HEADWATER_CONCURRENCY": "7"}, want: 3},
		{name: "flag from the environment", env: map[string]string{"HEADWATER_CONCURRENCY": "7"}, want: 7},
		{name: "alias not read from the environment", env: map[string]string{"HEADWATER_CONCURRENT": "9"}, want: 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for k, v := range tt.env {
				t.Setenv(k, v)
			}
			fs := flag.NewFlagSet("t", flag.ContinueOnError)
			got := fs.Int("concurrency", 1, "")
			fs.Var(aliasValue{fs.Lookup("concurrency").Value}, "concurrent", "")
			if err := Parse(fs, tt.args); err != nil {
				t.Fatal(err)
			}
			if *got != tt.want {
				t.Fatalf("concurrency = %d, want %d", *got, tt.want)
			}
		})
	}
}
