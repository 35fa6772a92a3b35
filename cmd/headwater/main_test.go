package main

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
)

func TestSplitTarget(t *testing.T) {
	for _, c := range []struct {
		name, program, env string
		args               []string
		target             string
		rest               []string
		err                string
	}{
		{name: "flag with value", program: "headwater", args: []string{"-target=fetcher", "-concurrency=2"},
			target: "fetcher", rest: []string{"-concurrency=2"}},
		{name: "double dash, value apart, not first", program: "headwater", args: []string{"-nats-url", "x", "--target", "watcher", "-v"},
			target: "watcher", rest: []string{"-nats-url", "x", "-v"}},
		{name: "flag wins over env", program: "headwater", env: "packager", args: []string{"-target=fetcher"},
			target: "fetcher", rest: []string{}},
		{name: "env", program: "headwater", env: "artifact-server", args: []string{"-storage-addr=:9"},
			target: "artifact-server", rest: []string{"-storage-addr=:9"}},
		{name: "program name", program: "packager", env: "fetcher", args: []string{"-target=watcher"},
			target: "packager", rest: []string{"-target=watcher"}},
		{name: "only the first -target is ours", program: "headwater", args: []string{"-target=setup", "ensure", "-target=x"},
			target: "setup", rest: []string{"ensure", "-target=x"}},
		{name: "after --", program: "headwater", env: "fetcher", args: []string{"--", "-target=watcher"},
			target: "fetcher", rest: []string{"--", "-target=watcher"}},
		{name: "none", program: "headwater", args: []string{"-version"}, target: "", rest: []string{"-version"}},
		{name: "unknown", program: "headwater", args: []string{"-target=fetchr"}, err: `unknown -target "fetchr"`},
		{name: "unknown env", program: "headwater", env: "nats", err: `unknown -target "nats"`},
		{name: "missing value", program: "headwater", args: []string{"-target"}, err: "flag needs an argument"},
	} {
		t.Run(c.name, func(t *testing.T) {
			target, rest, err := splitTarget(c.program, c.args, c.env)
			if c.err != "" {
				if err == nil || !strings.Contains(err.Error(), c.err) {
					t.Fatalf("error %v, want one with %q", err, c.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if target != c.target || !slices.Equal(rest, c.rest) {
				t.Errorf("got %q %q, want %q %q", target, rest, c.target, c.rest)
			}
		})
	}
}

// TestBinary builds the command and runs it as an operator would: every
// role answers -version under -target and under its own name (a link), and
// a command line without a role, or with an unknown one, is refused with
// the list of roles.
func TestBinary(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	dir := t.TempDir()
	bin := filepath.Join(dir, "headwater")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	run := func(program string, env []string, args ...string) (string, int) {
		cmd := exec.Command(program, args...)
		cmd.Env = append(os.Environ(), env...)
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		err := cmd.Run()
		code := 0
		if ee, ok := err.(*exec.ExitError); ok {
			code = ee.ExitCode()
		} else if err != nil {
			t.Fatal(err)
		}
		return out.String(), code
	}
	// versionOK reports whether out is the answer of role name to -version:
	// the build (buildinfo, with the Go version), after the role's name
	// except for setup, which prints the build alone.
	versionOK := func(name, out string) bool {
		return strings.Contains(out, runtime.Version()) && (name == "setup" || strings.HasPrefix(out, name+" version "))
	}
	for name := range roles {
		if out, code := run(bin, nil, "-target="+name, "-version"); code != 0 || !versionOK(name, out) {
			t.Errorf("-target=%s -version: exit %d, %q", name, code, out)
		}
		link := filepath.Join(dir, name)
		if err := os.Link(bin, link); err != nil {
			t.Fatal(err)
		}
		if out, code := run(link, []string{targetEnv + "=watcher"}, "-version"); code != 0 || !versionOK(name, out) {
			t.Errorf("%s -version: exit %d, %q", name, code, out)
		}
	}
	if out, code := run(bin, nil, "-version"); code != 0 || !strings.HasPrefix(out, "headwater version ") {
		t.Errorf("-version: exit %d, %q", code, out)
	}
	for _, args := range [][]string{nil, {"-target=nats"}, {"-concurrency=2"}} {
		out, code := run(bin, nil, args...)
		if code != 2 || !strings.Contains(out, "roles: artifact-server, dispatcher, fetcher, httpsource-fetcher, packager, receiver, setup, watcher") {
			t.Errorf("%q: exit %d, %q; want 2 and the roles", args, code, out)
		}
	}
}
