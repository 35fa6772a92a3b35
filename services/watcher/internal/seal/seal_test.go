package seal

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/headwater-gitops/headwater/pkg/events"
)

func testKey(t *testing.T, secret string) *Key {
	t.Helper()
	k, err := NewKey([]byte(secret))
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func sealedJob(k *Key) events.Job {
	job := events.Job{
		ID:             "uid-1/3/tok/1795250400/abcdef",
		Object:         events.ObjectRef{Kind: "GitRepository", Namespace: "default", Name: "podinfo", UID: "uid-1", Generation: 3},
		ReconcileToken: "tok",
		RequestedAt:    time.Date(2026, 11, 21, 10, 0, 0, 123456789, time.FixedZone("CET", 3600)),
	}
	k.Seal(&job)
	return job
}

// TestVerify changes each field a sealed job is identified by: every change
// breaks the seal, and a job as the bus carries it (through JSON) keeps it.
func TestVerify(t *testing.T) {
	k := testKey(t, strings.Repeat("s", 32))
	for name, change := range map[string]func(*events.Job){
		"unchanged":      func(*events.Job) {},
		"id":             func(j *events.Job) { j.ID += "x" },
		"kind":           func(j *events.Job) { j.Object.Kind = "Bucket" },
		"namespace":      func(j *events.Job) { j.Object.Namespace = "other" },
		"name":           func(j *events.Job) { j.Object.Name = "other" },
		"uid":            func(j *events.Job) { j.Object.UID = "uid-2" },
		"generation":     func(j *events.Job) { j.Object.Generation++ },
		"token":          func(j *events.Job) { j.ReconcileToken = "" },
		"requested at":   func(j *events.Job) { j.RequestedAt = j.RequestedAt.Add(time.Nanosecond) },
		"no seal":        func(j *events.Job) { j.Seal = "" },
		"garbage seal":   func(j *events.Job) { j.Seal = "not-a-seal" },
		"fields shifted": func(j *events.Job) { j.Object.Namespace, j.Object.Name = "defaultp", "odinfo" },
	} {
		t.Run(name, func(t *testing.T) {
			job := sealedJob(k)
			change(&job)
			err := k.Verify(job)
			if name == "unchanged" {
				if err != nil {
					t.Fatalf("a sealed job does not verify: %v", err)
				}
				return
			}
			if !errors.Is(err, ErrUnsealed) {
				t.Fatalf("Verify = %v, want ErrUnsealed", err)
			}
		})
	}
}

func TestSealSurvivesTheBus(t *testing.T) {
	k := testKey(t, strings.Repeat("s", 32))
	job := sealedJob(k)
	b, err := json.Marshal(job)
	if err != nil {
		t.Fatal(err)
	}
	var carried events.Job
	if err := json.Unmarshal(b, &carried); err != nil {
		t.Fatal(err)
	}
	if err := k.Verify(carried); err != nil {
		t.Fatalf("the seal did not survive JSON: %v (%s)", err, b)
	}
}

// TestKeys: replicas deriving from the same secret verify each other's
// jobs (a restart, a failover); any other secret does not.
func TestKeys(t *testing.T) {
	a, b := testKey(t, strings.Repeat("s", 32)), testKey(t, strings.Repeat("s", 32))
	if err := b.Verify(sealedJob(a)); err != nil {
		t.Errorf("same secret, another key: %v", err)
	}
	other := testKey(t, strings.Repeat("t", 32))
	if err := other.Verify(sealedJob(a)); !errors.Is(err, ErrUnsealed) {
		t.Errorf("another secret verified the job: %v", err)
	}
	if _, err := NewKey([]byte("short")); err == nil {
		t.Error("a 5-byte secret was accepted")
	}
}

func TestLoadKey(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	first, second := write("first", strings.Repeat("1", 40)), write("second", strings.Repeat("2", 40))
	k, err := LoadKey("", first, second)
	if err != nil {
		t.Fatal(err)
	}
	if err := testKey(t, strings.Repeat("1", 40)).Verify(sealedJob(k)); err != nil {
		t.Errorf("the key did not come from the first file set: %v", err)
	}
	if _, err := LoadKey("", ""); err == nil {
		t.Error("no files: no error")
	}
	if _, err := LoadKey(filepath.Join(dir, "missing")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("missing file: %v", err)
	}
	if _, err := LoadKey(write("short", "x")); err == nil {
		t.Error("a short secret file was accepted")
	}
}
