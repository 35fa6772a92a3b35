package events

import (
	"slices"
	"strings"
	"testing"
)

// TestStreamsOf: each service makes at start-up only the streams it
// publishes to or consumes, so a stream exists only where a component that
// uses it is deployed; the watcher's optional streams (hooks, delivery
// reports) are made by their own component, or by the watcher when it
// joins them.
func TestStreamsOf(t *testing.T) {
	for _, tc := range []struct {
		identity string
		want     []string
	}{
		{WatcherIdentity, []string{FetchStream, PackageStream, EventStream}},
		{FetcherIdentity, []string{FetchStream, PackageStream, PublishStream}},
		{PackagerIdentity, []string{PackageStream, PublishStream}},
		{ArtifactServerIdentity, []string{PublishStream, EventStream}},
		{ReceiverIdentity, []string{HookStream}},
		{DispatcherIdentity, []string{DeliveryStream, EventStream, SubscriptionStream}},
		{SubscriberIdentity, nil},
		{"a-test", []string{FetchStream, PackageStream, PublishStream, HookStream, DeliveryStream, EventStream, SubscriptionStream}}, // in Streams order
	} {
		if got := StreamsOf(tc.identity); !slices.Equal(got, tc.want) {
			t.Errorf("StreamsOf(%s) = %q, want %q", tc.identity, got, tc.want)
		}
	}
	for _, s := range Streams(1) {
		if StreamOwner(s.Name) == "" {
			t.Errorf("stream %s has no owner", s.Name)
		}
	}
	if got := StreamOwner(HookStream); got != WatcherIdentity {
		t.Errorf("owner of %s: %s, want the watcher", HookStream, got)
	}
	if got := StreamOwner(DeliveryStream); got != WatcherIdentity {
		t.Errorf("owner of %s: %s, want the watcher", DeliveryStream, got)
	}
}

// TestPermissionsCoverOnlyUsedStreams: an identity may look up and create
// the streams it uses (its optional ones included) and no other, and only
// the watcher listens for the creation of the delivery reports' stream.
func TestPermissionsCoverOnlyUsedStreams(t *testing.T) {
	for _, id := range Identities() {
		p, _ := Permissions(id)
		var created []string
		for _, s := range p.Publish {
			if name, ok := strings.CutPrefix(s, "$JS.API.STREAM.CREATE."); ok && !strings.HasPrefix(name, "KV_") {
				created = append(created, name)
			}
		}
		want := StreamsOf(id)
		if id == WatcherIdentity {
			want = append(want, DeliveryStream, HookStream)
		}
		slices.Sort(want)
		if !slices.Equal(created, want) {
			t.Errorf("%s may create %q, want %q", id, created, want)
		}
		advisory := slices.Contains(p.Subscribe, StreamCreatedAdvisory(DeliveryStream))
		if advisory != (id == WatcherIdentity) {
			t.Errorf("%s listens for the delivery stream's creation: %t", id, advisory)
		}
	}
}

// TestPluginIdentity: a plug-in kind's fetcher takes its kind's jobs only,
// through its own consumer, and publishes only its kind's package and
// publish subjects; the built-in fetchers' consumer leaves its jobs alone.
func TestPluginIdentity(t *testing.T) {
	id := PluginIdentity("HTTPSource")
	if id != "plugin-httpsource" {
		t.Fatalf("PluginIdentity = %q", id)
	}
	if kind, ok := PluginKindOf(id); !ok || kind != "httpsource" {
		t.Fatalf("PluginKindOf(%q) = %q, %t", id, kind, ok)
	}
	for _, bad := range []string{"plugin-", "plugin-a.b", "fetcher"} {
		if _, ok := PluginKindOf(bad); ok {
			t.Errorf("PluginKindOf(%q) is a plug-in", bad)
		}
	}
	p, ok := Permissions(id)
	if !ok {
		t.Fatal("no permissions for a plug-in identity")
	}
	for _, want := range []string{
		"headwater.jobs.package.httpsource", "headwater.jobs.publish.httpsource",
		"$JS.API.CONSUMER.MSG.NEXT.HEADWATER_FETCH.plugin-httpsource",
		"$JS.ACK.HEADWATER_FETCH.plugin-httpsource.>",
	} {
		if !slices.Contains(p.Publish, want) {
			t.Errorf("%s may not publish %s", id, want)
		}
	}
	for _, s := range p.Publish {
		if strings.HasPrefix(s, "headwater.") && !strings.HasSuffix(s, ".httpsource") {
			t.Errorf("%s may publish %s", id, s)
		}
		if strings.Contains(s, ".fetcher") || strings.HasSuffix(s, ".>") && strings.HasPrefix(s, "headwater.") {
			t.Errorf("%s may publish %s", id, s)
		}
	}
	// Its consumer is created only with its own kind's filter: no
	// unfiltered or legacy create, which carry any filter.
	if want := "$JS.API.CONSUMER.CREATE.HEADWATER_FETCH.plugin-httpsource.headwater.jobs.fetch.httpsource"; !slices.Contains(p.Publish, want) {
		t.Errorf("%s may not publish %s", id, want)
	}
	for _, s := range p.Publish {
		if strings.Contains(s, "DURABLE.CREATE") || strings.HasPrefix(s, "$JS.API.CONSUMER.CREATE.") && !strings.HasSuffix(s, ".headwater.jobs.fetch.httpsource") {
			t.Errorf("%s may publish %s", id, s)
		}
	}
	if c := Consumer(FetchStream, PluginConsumer("HTTPSource"), ConsumerOptions{FilterSubjects: ConsumerFilter(id, FetchStream)}); c.FilterSubject != FetchSubject("HTTPSource") || len(c.FilterSubjects) != 0 {
		t.Errorf("plug-in consumer filters %q %q, want FilterSubject %s", c.FilterSubject, c.FilterSubjects, FetchSubject("HTTPSource"))
	}
	if got := StreamsOf(id); !slices.Equal(got, []string{FetchStream, PackageStream, PublishStream}) {
		t.Errorf("StreamsOf(%s) = %q", id, got)
	}
	if got := ConsumerFilter(id, FetchStream); !slices.Equal(got, []string{"headwater.jobs.fetch.httpsource"}) {
		t.Errorf("ConsumerFilter(%s) = %q", id, got)
	}
	builtin := ConsumerFilter(FetcherIdentity, FetchStream)
	if slices.Contains(builtin, FetchSubject("HTTPSource")) || len(builtin) != len(BuiltinKinds) {
		t.Errorf("the built-in fetchers take %q", builtin)
	}
	if StreamOwner(FetchStream) != FetcherIdentity {
		t.Errorf("owner of %s: %s", FetchStream, StreamOwner(FetchStream))
	}
}

// TestFetchConsumer: each kind's fetch jobs are read from the consumer whose
// filter takes them (the built-in fetchers' for the built-in kinds, the
// plug-in's own for a plug-in kind), and the watcher may read that
// consumer's state (the fair share's backlog gate).
func TestFetchConsumer(t *testing.T) {
	watcher, ok := Permissions(WatcherIdentity)
	if !ok {
		t.Fatal("no permissions for the watcher")
	}
	for _, tc := range []struct{ kind, identity, consumer string }{
		{"GitRepository", FetcherIdentity, FetcherConsumer},
		{"HelmChart", FetcherIdentity, FetcherConsumer},
		{"HTTPSource", PluginIdentity("HTTPSource"), "plugin-httpsource"},
	} {
		got := FetchConsumer(tc.kind)
		if got != tc.consumer {
			t.Errorf("FetchConsumer(%s) = %s, want %s", tc.kind, got, tc.consumer)
		}
		if !slices.Contains(ConsumerFilter(tc.identity, FetchStream), FetchSubject(tc.kind)) {
			t.Errorf("%s's consumer does not take %s", tc.identity, FetchSubject(tc.kind))
		}
		if info := "$JS.API.CONSUMER.INFO." + FetchStream + "." + got; !slices.ContainsFunc(watcher.Publish, func(p string) bool {
			return p == info || p == "$JS.API.CONSUMER.INFO."+FetchStream+".*"
		}) {
			t.Errorf("the watcher may not read %s", info)
		}
	}
}
