package events

import (
	"bytes"
	"encoding/json"
	"errors"
	"maps"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/fluxcd/pkg/apis/meta"
	sourcev1 "github.com/fluxcd/source-controller/api/v1"
	swv1beta1 "github.com/fluxcd/source-watcher/api/v2/v1beta1"
	"github.com/nats-io/nats.go/jetstream"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func testJob() Job {
	return Job{
		ID: "0f3c-uid-7-token",
		Object: ObjectRef{
			Kind: "GitRepository", Namespace: "flux-system", Name: "podinfo.v2",
			UID: "6b1f0c52-7c4e-4bde-9a0b-1b2c3d4e5f60", Generation: 7,
			Labels: map[string]string{"app.kubernetes.io/part-of": "podinfo"},
		},
		ReconcileToken: "2026-01-02T03:04:05Z",
		RequestedAt:    time.Date(2026, 1, 2, 3, 4, 5, 600, time.UTC),
	}
}

func testArtifact() *meta.Artifact {
	size := int64(4096)
	return &meta.Artifact{
		Path:           "gitrepository/flux-system/podinfo.v2/abc.tar.gz",
		URL:            "http://artifact-server/gitrepository/flux-system/podinfo.v2/abc.tar.gz",
		Revision:       "main@sha1:0123456789abcdef0123456789abcdef01234567",
		Digest:         "sha256:ab12",
		LastUpdateTime: metav1.NewTime(time.Date(2026, 1, 2, 3, 4, 6, 0, time.UTC)),
		Size:           &size,
		Metadata:       map[string]string{"k": "v"},
	}
}

func testOutcome(failed bool) *Outcome {
	o := &Outcome{
		Job:          testJob(),
		Revision:     "main@sha1:0123456789abcdef0123456789abcdef01234567",
		Artifact:     testArtifact(),
		EventMessage: "stored artifact for commit 'Add README'",
		Notices:      []Notice{{Warning: true, Reason: "ArtifactVerificationFailed", Message: "rebuilding"}},
	}
	if failed {
		o.Artifact = nil
		o.Failure = &Failure{Condition: "FetchFailed", Reason: "GitOperationFailed", Message: "no such ref", Stalled: true}
	}
	return o
}

// sampleData returns a fully populated data struct for every event type.
func sampleData() map[string]any {
	ignore := "/*\n!/deploy\n"
	return map[string]any{
		TypeFetchRequested: &FetchRequested{
			Job: testJob(),
			GitRepository: &sourcev1.GitRepositorySpec{
				URL:       "https://github.com/stefanprodan/podinfo",
				SecretRef: &meta.LocalObjectReference{Name: "git-auth"},
				Interval:  metav1.Duration{Duration: time.Minute},
				Timeout:   &metav1.Duration{Duration: 30 * time.Second},
				Reference: &sourcev1.GitRepositoryRef{Branch: "main", SemVer: ">=1.0.0"},
				Ignore:    &ignore,
				Include: []sourcev1.GitRepositoryInclude{{
					GitRepositoryRef: meta.LocalObjectReference{Name: "other"}, FromPath: "a", ToPath: "b",
				}},
				SparseCheckout: []string{"deploy"},
			},
			Previous: testArtifact(),
			Force:    true,
		},
		TypeDeleteRequested: &DeleteRequested{Job: testJob()},
		TypeGenerateRequested: &GenerateRequested{
			Job: Job{ID: testJob().ID, RequestedAt: testJob().RequestedAt,
				Object: ObjectRef{Kind: ArtifactGeneratorKind, Namespace: "apps", Name: "monorepo", UID: "5e2a", Generation: 3}},
			Revision: "sha256:9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08",
			Sources:  []GeneratorSource{{Alias: "repo", Kind: "GitRepository", Namespace: "apps", Name: "monorepo", Artifact: *testArtifact()}},
			Artifacts: []swv1beta1.OutputArtifact{{Name: "app-a", OriginRevision: "@repo",
				Copy: []swv1beta1.CopyOperation{{From: "@repo/apps/a/**", To: "@artifact/", Exclude: []string{"*.md"}},
					{From: "@repo/values.yaml", To: "@artifact/values.yaml", Strategy: swv1beta1.MergeStrategy}}}},
			PathPattern: "@repo/apps/{app}",
			Foreign:     []string{"app-z"},
			Previous:    []GeneratedOutput{{Name: "app-a", Artifact: *testArtifact(), Labels: map[string]string{"app": "a"}}},
		},
		TypeFetched: &Fetched{
			Job:          testJob(),
			Revision:     "main@sha1:0123456789abcdef0123456789abcdef01234567",
			Staging:      "staging/0f3c-uid-7-token.tar",
			ArtifactName: "0123456789abcdef0123456789abcdef01234567.tar.gz",
			EventMessage: "stored artifact for commit 'Add README'",
			Notices:      []Notice{{Reason: "Progressing", Message: "m"}},
		},
		TypeFetchUnchanged:    testOutcome(false),
		TypeFetchFailed:       testOutcome(true),
		TypePackaged:          testOutcome(false),
		TypePackageFailed:     testOutcome(true),
		TypeDeleted:           &Outcome{Job: testJob()},
		TypeArtifactStored:    testOutcome(false),
		TypeArtifactUnchanged: testOutcome(false),
		TypeArtifactFailed:    testOutcome(true),
		TypeArtifactDeleted:   &Outcome{Job: testJob()},
		TypeHookReceived: &HookReceived{
			Job: Job{ID: testJob().ID, RequestedAt: testJob().RequestedAt,
				Object: ObjectRef{Kind: ReceiverKind, Namespace: "flux-system", Name: "github", UID: "9c1d", Generation: 2}},
			Type:  "github",
			Event: "push",
			Resources: []HookResource{
				{Kind: "GitRepository", Name: "podinfo.v2", Namespace: "flux-system"},
				{APIVersion: "source.toolkit.fluxcd.io/v1", Kind: "OCIRepository", Name: "*", Namespace: "apps",
					MatchLabels: map[string]string{"team": "a"}},
			},
		},
		TypeDeliveryReported: &DeliveryReport{
			Subscription:  SubscriptionRef{Namespace: "team-a", Name: "ci", UID: "0c4e-uid", Generation: 2},
			Dispatcher:    "dispatcher-7d9f",
			Delivered:     12,
			Failed:        5,
			DeadLettered:  1,
			LastDelivered: &time.Time{},
			LastDeadLetter: &DeadLetter{
				EventID: "0f3c-uid-7-token/io.headwater.artifact.stored.v1", EventType: TypeArtifactStored,
				Subject: "gitrepository/flux-system/podinfo.v2", Time: time.Date(2026, 1, 2, 3, 4, 8, 0, time.UTC),
				Attempts: 5, Error: "HTTP 500 Internal Server Error",
			},
			Problem: &Failure{Reason: "SecretNotFound", Message: "secret team-a/hmac not found"},
		},
		TypeArtifactAddress: &ArtifactAddress{BaseURL: "http://source-controller.flux-system.svc.cluster.local./"},
	}
}

func TestSampleDataCoversEveryType(t *testing.T) {
	got := slices.Sorted(maps.Keys(sampleData()))
	want := slices.Sorted(maps.Keys(dataTypes))
	if !slices.Equal(got, want) {
		t.Fatalf("sample data types %q, known types %q", got, want)
	}
	for typ, d := range sampleData() {
		if reflect.TypeOf(d) != reflect.TypeOf(dataTypes[typ]()) {
			t.Errorf("%s: sample is %T, Decode makes %T", typ, d, dataTypes[typ]())
		}
	}
}

func TestEncodeDecodeRoundTrip(t *testing.T) {
	for typ, data := range sampleData() {
		t.Run(typ, func(t *testing.T) {
			job := JobOf(data)
			id := MessageID(job, typ)
			subject := ObjectSubject(job.Object)
			if r, ok := data.(*DeliveryReport); ok {
				id, subject = "dispatcher-7d9f/1", "subscription/"+r.Subscription.Namespace+"/"+r.Subscription.Name
			} else if _, ok := data.(*ArtifactAddress); ok {
				id, subject = "artifact-server-7d9f/1", "artifact-server"
			} else if want := "artifactgenerator/apps/monorepo"; typ == TypeGenerateRequested && subject != want {
				t.Fatalf("subject %q, want %q", subject, want)
			} else if want := "gitrepository/flux-system/podinfo.v2"; typ != TypeHookReceived && typ != TypeGenerateRequested && subject != want {
				t.Fatalf("subject %q, want %q", subject, want)
			} else if want := "receiver/flux-system/github"; typ == TypeHookReceived && subject != want {
				t.Fatalf("subject %q, want %q", subject, want)
			}
			before := time.Now().UTC().Add(-time.Second)
			body, err := Encode("fetcher", typ, id, subject, data)
			if err != nil {
				t.Fatalf("Encode: %v", err)
			}
			m, err := Decode(body)
			if err != nil {
				t.Fatalf("Decode: %v", err)
			}

			e := m.Event
			for _, c := range []struct{ attr, got, want string }{
				{"id", e.ID(), id},
				{"source", e.Source(), "headwater/fetcher"},
				{"type", e.Type(), typ},
				{"subject", e.Subject(), subject},
				{"datacontenttype", e.DataContentType(), "application/json"},
				{"specversion", e.SpecVersion(), "1.0"},
			} {
				if c.got != c.want {
					t.Errorf("%s = %q, want %q", c.attr, c.got, c.want)
				}
			}
			if e.Time().Before(before) || e.Time().After(time.Now().Add(time.Second)) {
				t.Errorf("time %v is not now", e.Time())
			}

			// Structured mode: data is inline JSON, not base64.
			var raw map[string]json.RawMessage
			if err := json.Unmarshal(body, &raw); err != nil {
				t.Fatal(err)
			}
			if _, ok := raw["data_base64"]; ok {
				t.Error("data is base64-encoded")
			}
			if d := bytes.TrimSpace(raw["data"]); len(d) == 0 || d[0] != '{' {
				t.Errorf("data %s is not a JSON object", d)
			}
			if string(raw["specversion"]) != `"1.0"` {
				t.Errorf("specversion %s", raw["specversion"])
			}

			if reflect.TypeOf(m.Data) != reflect.TypeOf(data) {
				t.Fatalf("data is %T, want %T", m.Data, data)
			}
			want, _ := json.Marshal(data)
			got, _ := json.Marshal(m.Data)
			if !bytes.Equal(got, want) {
				t.Errorf("data changed:\n got %s\nwant %s", got, want)
			}
			if j := JobOf(m.Data); j.ID != job.ID || !reflect.DeepEqual(j.Object, job.Object) || !j.RequestedAt.Equal(job.RequestedAt) || j.ReconcileToken != job.ReconcileToken {
				t.Errorf("job %+v, want %+v", j, job)
			}
		})
	}
}

func TestRoundTripKeepsDetails(t *testing.T) {
	in := sampleData()[TypeFetchRequested].(*FetchRequested)
	body, err := Encode("watcher", TypeFetchRequested, "id", "s", in)
	if err != nil {
		t.Fatal(err)
	}
	m, err := Decode(body)
	if err != nil {
		t.Fatal(err)
	}
	out := m.Data.(*FetchRequested)
	switch {
	case out.GitRepository == nil || out.GitRepository.Reference == nil || out.GitRepository.Reference.SemVer != ">=1.0.0":
		t.Errorf("git reference lost: %+v", out.GitRepository)
	case out.GitRepository.Interval.Duration != time.Minute || out.GitRepository.Timeout.Duration != 30*time.Second:
		t.Errorf("durations changed: %+v", out.GitRepository)
	case out.GitRepository.Ignore == nil || *out.GitRepository.Ignore != *in.GitRepository.Ignore:
		t.Errorf("ignore changed")
	case out.Previous == nil || *out.Previous.Size != 4096 || !out.Previous.LastUpdateTime.Equal(&in.Previous.LastUpdateTime):
		t.Errorf("previous artifact changed: %+v", out.Previous)
	case !out.Force || out.Bucket != nil:
		t.Errorf("force %v bucket %v", out.Force, out.Bucket)
	case out.Job.RequestedAt.Nanosecond() != 600:
		t.Errorf("requestedAt lost precision: %v", out.Job.RequestedAt)
	}
}

func TestEncodeUnknownType(t *testing.T) {
	if _, err := Encode("x", "io.headwater.nope.v1", "id", "s", &Outcome{Job: testJob()}); err == nil {
		t.Error("unknown type: no error")
	}
	if _, err := Encode("x", TypeDeleted, "id", "s", func() {}); err == nil {
		t.Error("unencodable data: no error")
	}
}

// mutated encodes a valid event of typ, lets change edit its JSON object,
// and returns the result.
func mutated(t *testing.T, typ string, data any, change func(map[string]any)) []byte {
	t.Helper()
	body, err := Encode("fetcher", typ, "id-1", "gitrepository/ns/name", data)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(body, &m); err != nil {
		t.Fatal(err)
	}
	change(m)
	b, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestDecodeMalformed(t *testing.T) {
	outcome := &Outcome{Job: testJob()}
	fetched := sampleData()[TypeFetched].(*Fetched)
	withJob := func(edit func(j *Job)) *Outcome {
		o := *outcome
		edit(&o.Job)
		return &o
	}
	tests := []struct {
		name string
		body []byte
	}{
		{"empty", nil},
		{"not json", []byte("hello, world")},
		{"truncated json", mutated(t, TypeDeleted, outcome, func(map[string]any) {})[:40]},
		{"json array", []byte(`[1,2,3]`)},
		{"json null", []byte(`null`)},
		{"json string", []byte(`"io.headwater.job.fetch.requested.v1"`)},
		{"json not a cloudevent", []byte(`{"hello":"world","job":{"id":"x"}}`)},
		{"no specversion", mutated(t, TypeDeleted, outcome, func(m map[string]any) { delete(m, "specversion") })},
		{"bad specversion", mutated(t, TypeDeleted, outcome, func(m map[string]any) { m["specversion"] = "9.9" })},
		{"no id", mutated(t, TypeDeleted, outcome, func(m map[string]any) { delete(m, "id") })},
		{"no source", mutated(t, TypeDeleted, outcome, func(m map[string]any) { delete(m, "source") })},
		{"no type", mutated(t, TypeDeleted, outcome, func(m map[string]any) { delete(m, "type") })},
		{"unknown type", mutated(t, TypeDeleted, outcome, func(m map[string]any) { m["type"] = "io.headwater.job.fetch.requested.v2" })},
		{"data a string", mutated(t, TypeDeleted, outcome, func(m map[string]any) { m["data"] = "job" })},
		{"data an array", mutated(t, TypeDeleted, outcome, func(m map[string]any) { m["data"] = []any{1, 2} })},
		{"job a string", mutated(t, TypeDeleted, outcome, func(m map[string]any) { m["data"] = map[string]any{"job": "abc"} })},
		{"generation a string", mutated(t, TypeDeleted, outcome, func(m map[string]any) {
			m["data"].(map[string]any)["job"].(map[string]any)["object"].(map[string]any)["generation"] = "seven"
		})},
		{"spec wrong shape", mutated(t, TypeFetchRequested, sampleData()[TypeFetchRequested], func(m map[string]any) {
			m["data"].(map[string]any)["gitRepository"] = []any{"url"}
		})},
		{"no data", mutated(t, TypeDeleted, outcome, func(m map[string]any) { delete(m, "data") })},
		{"data null", mutated(t, TypeDeleted, outcome, func(m map[string]any) { m["data"] = nil })},
		{"binary data", mutated(t, TypeDeleted, outcome, func(m map[string]any) {
			delete(m, "data")
			m["data_base64"] = "AAECAwQ="
			m["datacontenttype"] = "application/octet-stream"
		})},
		{"job without id", mutated(t, TypeDeleted, withJob(func(j *Job) { j.ID = "" }), func(map[string]any) {})},
		{"job without kind", mutated(t, TypeDeleted, withJob(func(j *Job) { j.Object.Kind = "" }), func(map[string]any) {})},
		{"job without namespace", mutated(t, TypeDeleted, withJob(func(j *Job) { j.Object.Namespace = "" }), func(map[string]any) {})},
		{"job without name", mutated(t, TypeDeleted, withJob(func(j *Job) { j.Object.Name = "" }), func(map[string]any) {})},
		{"request without job", mutated(t, TypeFetchRequested, &FetchRequested{}, func(map[string]any) {})},
		{"fetched without staging", mutated(t, TypeFetched, fetched, func(m map[string]any) {
			delete(m["data"].(map[string]any), "staging")
		})},
		{"fetched without artifact name", mutated(t, TypeFetched, fetched, func(m map[string]any) {
			m["data"].(map[string]any)["artifactName"] = ""
		})},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			m, err := Decode(tc.body)
			t.Log(err)
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("error %v, want one wrapping ErrMalformed", err)
			}
			if m != nil {
				t.Errorf("message %+v returned with the error", m)
			}
		})
	}
}

func TestDecodeToleratesUnknownFields(t *testing.T) {
	body := mutated(t, TypeDeleted, &Outcome{Job: testJob()}, func(m map[string]any) {
		m["data"].(map[string]any)["addedLater"] = true
		m["traceparent"] = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
	})
	if _, err := Decode(body); err != nil {
		t.Fatalf("a compatible addition was rejected: %v", err)
	}
}

func TestSubjects(t *testing.T) {
	tests := []struct {
		name, got, want string
	}{
		{"fetch", FetchSubject("GitRepository"), "headwater.jobs.fetch.gitrepository"},
		{"package", PackageSubject("Bucket"), "headwater.jobs.package.bucket"},
		{"publish", PublishSubject("HelmChart"), "headwater.jobs.publish.helmchart"},
		{"event", EventSubject("GitRepository", "flux-system", "podinfo"), "headwater.events.gitrepository.flux-system.podinfo"},
		{"event dotted name", EventSubject("GitRepository", "flux-system", "my.app.v1"), "headwater.events.gitrepository.flux-system.my_app_v1"},
		{"event upper-case kind", EventSubject("OCIRepository", "ns", "n"), "headwater.events.ocirepository.ns.n"},
		{"event wildcards", EventSubject("Bucket", "n*s", "a>b c"), "headwater.events.bucket.n_s.a_b_c"},
		{"hook", HookSubject("flux-system", "github.app"), "headwater.hooks.flux-system.github_app"},
		{"object", ObjectSubject(ObjectRef{Kind: "GitRepository", Namespace: "flux-system", Name: "my.app"}), "gitrepository/flux-system/my.app"},
	}
	for _, tc := range tests {
		if tc.got != tc.want {
			t.Errorf("%s: %q, want %q", tc.name, tc.got, tc.want)
		}
	}
	// Every event subject is exactly five tokens, whatever the name.
	for _, name := range []string{"a", "a.b", "a.b.c.d", "x*", ">"} {
		s := EventSubject("GitRepository", "ns", name)
		if n := len(strings.Split(s, ".")); n != 5 {
			t.Errorf("EventSubject(%q) = %q has %d tokens, want 5", name, s, n)
		}
		if strings.ContainsAny(s, "*> \t\r\n") {
			t.Errorf("EventSubject(%q) = %q contains a NATS wildcard or white space", name, s)
		}
	}
}

func TestMessageID(t *testing.T) {
	job := testJob()
	later := job
	later.RequestedAt = job.RequestedAt.Add(time.Hour)
	later.ReconcileToken = "other"
	other := job
	other.ID = "another-job"

	if a, b := MessageID(job, TypeFetchRequested), MessageID(job, TypeFetchRequested); a != b || a == "" {
		t.Errorf("same job and type: %q then %q", a, b)
	}
	if MessageID(job, TypeFetchRequested) != MessageID(later, TypeFetchRequested) {
		t.Error("the message ID depends on more than the job ID and the type")
	}
	ids := map[string]string{}
	for _, j := range []Job{job, other} {
		for typ := range dataTypes {
			id := MessageID(j, typ)
			if prev, dup := ids[id]; dup {
				t.Errorf("MessageID %q for both %s and %s/%s", id, prev, j.ID, typ)
			}
			ids[id] = j.ID + "/" + typ
		}
	}
}

func TestPublicType(t *testing.T) {
	tests := []struct {
		internal, public string
		ok               bool
	}{
		{TypePackaged, TypeArtifactStored, true},
		{TypeFetchUnchanged, TypeArtifactUnchanged, true},
		{TypeFetchFailed, TypeArtifactFailed, true},
		{TypePackageFailed, TypeArtifactFailed, true},
		{TypeDeleted, TypeArtifactDeleted, true},
		{TypeFetchRequested, "", false},
		{TypeDeleteRequested, "", false},
		{TypeGenerateRequested, "", false},
		{TypeFetched, "", false},
		{TypeArtifactStored, "", false},
		{TypeArtifactUnchanged, "", false},
		{TypeArtifactFailed, "", false},
		{TypeArtifactDeleted, "", false},
		{TypeHookReceived, "", false},
		{TypeDeliveryReported, "", false},
		{TypeArtifactAddress, "", false},
		{"", "", false},
		{"io.headwater.job.package.succeeded.v2", "", false},
	}
	covered := map[string]bool{}
	for _, tc := range tests {
		covered[tc.internal] = true
		public, ok := PublicType(tc.internal)
		if public != tc.public || ok != tc.ok {
			t.Errorf("PublicType(%q) = %q, %v; want %q, %v", tc.internal, public, ok, tc.public, tc.ok)
		}
		if ok {
			if _, known := dataTypes[public]; !known {
				t.Errorf("PublicType(%q) = %q, which Decode does not know", tc.internal, public)
			}
		}
	}
	for typ := range dataTypes {
		if !covered[typ] {
			t.Errorf("type %s is not in the table", typ)
		}
	}
}

func TestJobOf(t *testing.T) {
	for typ, data := range sampleData() {
		switch data.(type) {
		case *DeliveryReport, *ArtifactAddress:
			continue // names a Subscription, or nothing: not a job
		}
		if j := JobOf(data); j.ID != testJob().ID {
			t.Errorf("%s: JobOf = %+v", typ, j)
		}
	}
	if j := JobOf("not data"); !reflect.DeepEqual(j, Job{}) {
		t.Errorf("JobOf(string) = %+v, want zero", j)
	}
}

// subjectsOverlap reports whether some subject matches both NATS subject
// filters a and b.
func subjectsOverlap(a, b string) bool {
	ta, tb := strings.Split(a, "."), strings.Split(b, ".")
	for i := 0; i < len(ta) && i < len(tb); i++ {
		if ta[i] == ">" || tb[i] == ">" {
			// ">" takes one or more tokens, and the other has token i.
			return true
		}
		if ta[i] != tb[i] && ta[i] != "*" && tb[i] != "*" {
			return false
		}
	}
	return len(ta) == len(tb)
}

// subjectMatches reports whether the literal subject s matches filter f.
func subjectMatches(f, s string) bool {
	tf, ts := strings.Split(f, "."), strings.Split(s, ".")
	for i, tok := range tf {
		if tok == ">" {
			return len(ts) > i
		}
		if i >= len(ts) || (tok != "*" && tok != ts[i]) {
			return false
		}
	}
	return len(tf) == len(ts)
}

func TestSubjectHelpers(t *testing.T) {
	tests := []struct {
		a, b    string
		overlap bool
	}{
		{"a.>", "a.b", true},
		{"a.>", "b.>", false},
		{"a.>", "a", false},
		{"a.*", "a.b.c", false},
		{"a.*.c", "a.b.>", true},
		{"headwater.jobs.fetch.>", "headwater.jobs.>", true},
		{"headwater.jobs.fetch.>", "headwater.jobs.package.>", false},
	}
	for _, tc := range tests {
		if got := subjectsOverlap(tc.a, tc.b); got != tc.overlap {
			t.Errorf("overlap(%q, %q) = %v", tc.a, tc.b, got)
		}
		if got := subjectsOverlap(tc.b, tc.a); got != tc.overlap {
			t.Errorf("overlap(%q, %q) = %v", tc.b, tc.a, got)
		}
	}
}

func TestStreams(t *testing.T) {
	streams := Streams(1)
	byName := map[string]jetstream.StreamConfig{}
	for _, s := range streams {
		if _, dup := byName[s.Name]; dup {
			t.Errorf("stream %s declared twice", s.Name)
		}
		byName[s.Name] = s
		if s.Duplicates != DuplicateWindow {
			t.Errorf("%s: duplicate window %v, want %v", s.Name, s.Duplicates, DuplicateWindow)
		}
		if s.Storage != jetstream.FileStorage || s.MaxAge <= 0 || s.Description == "" {
			t.Errorf("%s: storage %v max age %v description %q", s.Name, s.Storage, s.MaxAge, s.Description)
		}
		if strings.ContainsAny(s.Name, ".*> ") {
			t.Errorf("stream name %q is not a valid JetStream name", s.Name)
		}
	}
	if got, want := slices.Sorted(maps.Keys(byName)), []string{DeliveryStream, EventStream, FetchStream, HookStream, PackageStream, PublishStream, SubscriptionStream}; !slices.Equal(got, want) {
		t.Fatalf("streams %q, want %q", got, want)
	}
	for _, name := range []string{FetchStream, PackageStream, PublishStream, HookStream, DeliveryStream} {
		if byName[name].Retention != jetstream.WorkQueuePolicy {
			t.Errorf("%s: retention %v, want work queue", name, byName[name].Retention)
		}
	}
	if s := byName[EventStream]; s.Retention != jetstream.LimitsPolicy || s.MaxMsgsPerSubject <= 0 {
		t.Errorf("%s: retention %v, max per subject %d", EventStream, s.Retention, s.MaxMsgsPerSubject)
	}

	// No subject may be captured by two streams (JetStream refuses
	// overlapping work queues, and a message must have one home).
	for i, a := range streams {
		for _, b := range streams[i+1:] {
			for _, fa := range a.Subjects {
				for _, fb := range b.Subjects {
					if subjectsOverlap(fa, fb) {
						t.Errorf("subjects %q of %s and %q of %s overlap", fa, a.Name, fb, b.Name)
					}
				}
			}
		}
	}

	// Each subject helper lands in exactly the stream meant for it.
	for _, tc := range []struct{ subject, stream string }{
		{FetchSubject("GitRepository"), FetchStream},
		{FetchSubject("Bucket"), FetchStream},
		{PackageSubject("GitRepository"), PackageStream},
		{PublishSubject("GitRepository"), PublishStream},
		{EventSubject("GitRepository", "flux-system", "a.b"), EventStream},
		{HookSubject("flux-system", "github"), HookStream},
	} {
		var in []string
		for _, s := range streams {
			for _, f := range s.Subjects {
				if subjectMatches(f, tc.subject) {
					in = append(in, s.Name)
				}
			}
		}
		if !slices.Equal(in, []string{tc.stream}) {
			t.Errorf("subject %s is captured by %q, want only %s", tc.subject, in, tc.stream)
		}
	}
}

func TestConsumer(t *testing.T) {
	c := Consumer(FetchStream, FetcherConsumer, ConsumerOptions{})
	if c.Durable != FetcherConsumer || c.AckPolicy != jetstream.AckExplicitPolicy ||
		c.AckWait != 30*time.Second || c.MaxDeliver != DefaultMaxDeliver || c.MaxAckPending != 1024 ||
		c.DeliverPolicy != jetstream.DeliverAllPolicy || c.Description == "" {
		t.Errorf("defaults: %+v", c)
	}
	if c.FilterSubject != "" || len(c.FilterSubjects) != 0 {
		t.Errorf("defaults filter %q %q, want the whole stream", c.FilterSubject, c.FilterSubjects)
	}

	c = Consumer(EventStream, WatcherConsumer, ConsumerOptions{MaxAckPending: 8, AckWait: time.Second, MaxDeliver: 20, DeliverNew: true})
	if c.Durable != WatcherConsumer || c.MaxAckPending != 8 || c.AckWait != time.Second ||
		c.MaxDeliver != 20 || c.DeliverPolicy != jetstream.DeliverNewPolicy {
		t.Errorf("options: %+v", c)
	}

	c = Consumer(PackageStream, PackagerConsumer, ConsumerOptions{MaxAckPending: -3, AckWait: -time.Second, MaxDeliver: -1})
	if c.MaxAckPending != 1024 || c.AckWait != 30*time.Second || c.MaxDeliver != -1 {
		t.Errorf("negative options: %+v", c)
	}
}

// TestStreamReplicas: every stream is kept in the copies asked for, at
// least one.
func TestStreamReplicas(t *testing.T) {
	for _, tc := range []struct{ replicas, want int }{{0, 1}, {1, 1}, {3, 3}, {-2, 1}} {
		for _, s := range Streams(tc.replicas) {
			if s.Replicas != tc.want {
				t.Errorf("Streams(%d): %s has %d replicas, want %d", tc.replicas, s.Name, s.Replicas, tc.want)
			}
		}
	}
}

// TestCheckRoute: a job travels only on its own kind's subjects.
func TestCheckRoute(t *testing.T) {
	job := Job{ID: "j", Object: ObjectRef{Kind: "HTTPSource", Namespace: "ns", Name: "n"}}
	for _, tc := range []struct {
		subject string
		ok      bool
	}{
		{FetchSubject("HTTPSource"), true},
		{PackageSubject("HTTPSource"), true},
		{PublishSubject("HTTPSource"), true},
		{PackageSubject("GitRepository"), false},
		{PublishSubject("GitRepository"), false},
		{EventSubject("GitRepository", "ns", "n"), true}, // not a job subject
	} {
		err := CheckRoute(tc.subject, job)
		if (err == nil) != tc.ok || err != nil && !errors.Is(err, ErrMalformed) {
			t.Errorf("CheckRoute(%s) = %v, want ok %t", tc.subject, err, tc.ok)
		}
	}
}

// TestWatcherShardConsumer: the unsharded watcher keeps its consumer; each
// shard has its own.
func TestWatcherShardConsumer(t *testing.T) {
	if got := WatcherShardConsumer(""); got != WatcherConsumer {
		t.Errorf("unsharded consumer %q, want %q", got, WatcherConsumer)
	}
	a, b := WatcherShardConsumer("0a1b2c3d"), WatcherShardConsumer("4e5f6a7b")
	if a != "watcher-0a1b2c3d" || a == b {
		t.Errorf("shard consumers %q and %q, want watcher-<shard>, one each", a, b)
	}
}
