package bench

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/labels"

	"github.com/headwater-gitops/headwater/e2e/harness"
)

// TestShardLabelsSplitEvenly checks that the labels of -shards spread the
// sources over the shards within one of each other, that each shard's
// selector matches exactly the sources labelled for it, and that
// shardTable counts what the selectors select.
func TestShardLabelsSplitEvenly(t *testing.T) {
	for _, tt := range []struct{ sources, shards int }{{1000, 1}, {1000, 2}, {1000, 3}, {10, 4}, {3, 5}} {
		t.Run(fmt.Sprintf("%d over %d", tt.sources, tt.shards), func(t *testing.T) {
			table := shardTable(tt.sources, tt.shards)
			if len(table) != tt.shards {
				t.Fatalf("%d shards in the table, want %d", len(table), tt.shards)
			}
			owners := make([]int, tt.sources) // how many shards select each source
			for s, sh := range table {
				sel, err := labels.Parse(sh.Selector)
				if err != nil {
					t.Fatalf("shard %d's selector %q: %v", s, sh.Selector, err)
				}
				matched := 0
				for i := range tt.sources {
					if sel.Matches(labels.Set(shardLabels(i, tt.shards))) {
						matched++
						owners[i]++
						if i%tt.shards != s {
							t.Errorf("shard %d (%s) selects source %d, which is shard %d's", s, sh.Selector, i, i%tt.shards)
						}
					}
				}
				if matched != sh.Sources {
					t.Errorf("shard %d's selector matches %d sources, the table says %d", s, matched, sh.Sources)
				}
			}
			for i, n := range owners {
				if n != 1 {
					t.Errorf("source %d is selected by %d shards, want 1", i, n)
				}
			}
			sizes := make([]int, len(table))
			for i, sh := range table {
				sizes[i] = sh.Sources
			}
			if slices.Max(sizes)-slices.Min(sizes) > 1 {
				t.Errorf("shard sizes %v differ by more than one", sizes)
			}
		})
	}
}

// TestShardLabelsNone checks that without shards the sources carry no
// label and the Env keeps its one unsharded watcher.
func TestShardLabelsNone(t *testing.T) {
	if l := shardLabels(7, 0); l != nil {
		t.Errorf("labels without shards: %v", l)
	}
	var cfg harness.Config
	shardWatchers(&cfg, 0)
	if cfg.WatcherReplicas != 0 || cfg.WatcherArgs != nil {
		t.Errorf("no shards changed the config: replicas %d, args %v", cfg.WatcherReplicas, cfg.WatcherArgs)
	}
}

// TestShardWatchers checks that each watcher process gets its own shard's
// selector, in the order of the table's process names.
func TestShardWatchers(t *testing.T) {
	var cfg harness.Config
	shardWatchers(&cfg, 3)
	if cfg.WatcherReplicas != 3 || len(cfg.WatcherArgs) != 3 {
		t.Fatalf("replicas %d, args %v; want 3 of each", cfg.WatcherReplicas, cfg.WatcherArgs)
	}
	wantProcs := []string{"watcher", "watcher-2", "watcher-3"}
	for i, sh := range shardTable(9, 3) {
		if got := strings.Join(cfg.WatcherArgs[i], " "); got != "-watch-label-selector "+sh.Selector {
			t.Errorf("watcher %d's args %q, want its shard's selector %q", i, got, sh.Selector)
		}
		if sh.Process != wantProcs[i] {
			t.Errorf("shard %d runs in %q, want %q (the harness's replica names)", i, sh.Process, wantProcs[i])
		}
	}
}

// TestWriteShards checks the per-shard lines: each shard's own process,
// its costs per source it owns, and the sum over the shards.
func TestWriteShards(t *testing.T) {
	m := &Measurement{
		Shards: shardTable(1000, 2),
		Usage: []Usage{
			{Name: "watcher", Role: RoleService, CPU: 1500 * time.Millisecond, PeakRSS: 40 * mib, Bus: &BusTraffic{InMsgs: 2000, OutMsgs: 3000}},
			{Name: "watcher-2", Role: RoleService, CPU: 500 * time.Millisecond, PeakRSS: 30 * mib, Bus: &BusTraffic{InMsgs: 1000, OutMsgs: 3000}},
		},
		APIRequestsByProcess: map[string]map[string]float64{
			"watcher":   {"PATCH/200": 1000, "POST/201": 500},
			"watcher-2": {"PATCH/200": 1000, "POST/201": 500},
		},
	}
	var b strings.Builder
	writeShards(&b, m)
	out := b.String()
	for _, want := range []string{
		"shard shard1 (watcher, -watch-label-selector=sharding.fluxcd.io/key=shard1, 500 sources): CPU 1.50 s (3.00 ms per source), peak RSS 40 MiB",
		"API requests 1500 (3.00 per source: PATCH 1000, POST 500)",
		"bus: sent 2000 messages (4.00 per source",
		"shard shard2 (watcher-2, -watch-label-selector=sharding.fluxcd.io/key=shard2, 500 sources): CPU 0.50 s (1.00 ms per source)",
		"received 3000 (6.00 per source",
		"the 2 shards together (1000 sources): CPU 2.00 s (2.00 ms per source), peak RSS 70 MiB",
		"API requests 3000 (3.00 per source: PATCH 2000, POST 1000); bus: sent 3000 messages (3.00 per source",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("missing %q in:\n%s", want, out)
		}
	}

	m.Shards, m.Usage = shardTable(1000, 1), m.Usage[:1]
	b.Reset()
	writeShards(&b, m)
	if n := strings.Count(b.String(), "\n"); n != 1 || strings.Contains(b.String(), "together") {
		t.Errorf("one shard: want its one line and no sum, got:\n%s", b.String())
	}
}
