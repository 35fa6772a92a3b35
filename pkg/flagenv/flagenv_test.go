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
