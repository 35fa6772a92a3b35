package bench

import (
	"fmt"

	"github.com/headwater-gitops/headwater/e2e/harness"
)

// ShardKey is the label of Flux's sharding docs, which the watcher shards
// of -shards select on (docs/sharding.md).
const ShardKey = "sharding.fluxcd.io/key"

// Shard is one watcher shard of a measurement (-shards): its process and
// its share of the sources.
type Shard struct {
	// Name is the value of ShardKey its sources carry ("shard1").
	Name string
	// Process is the watcher process that runs it, a name of
	// Measurement.Usage ("watcher", "watcher-2", ...).
	Process string
	// Selector is its -watch-label-selector.
	Selector string
	// Sources is how many of the scenario's sources carry its label.
	Sources int
}

// shardName is the label value of the i-th shard (from 0): "shard1", ...
func shardName(i int) string { return fmt.Sprintf("shard%d", i+1) }

// shardSelector is the -watch-label-selector of the i-th shard.
func shardSelector(i int) string { return ShardKey + "=" + shardName(i) }

// shardLabels are the labels of the source of index i when the sources
// are spread round-robin over shards watcher shards; nil without shards.
func shardLabels(i, shards int) map[string]string {
	if shards <= 0 {
		return nil
	}
	return map[string]string{ShardKey: shardName(i % shards)}
}

// shardWatchers configures cfg to run shards watcher processes, the i-th
// (watcher, watcher-2, ...) with the i-th shard's selector; the fetchers,
// packagers and artifact-servers stay shared by all, as docs/sharding.md
// deploys them. 0 shards leaves cfg as it is: one unsharded watcher.
func shardWatchers(cfg *harness.Config, shards int) {
	if shards <= 0 {
		return
	}
	cfg.WatcherReplicas = shards
	cfg.WatcherArgs = make([][]string, shards)
	for i := range shards {
		// Appended after ExtraArgs, as are the replicas' own addresses.
		cfg.WatcherArgs[i] = []string{"-watch-label-selector", shardSelector(i)}
	}
}

// shardTable is what each of shards watcher shards owns of sources
// spread by shardLabels, with the processes shardWatchers names them by.
func shardTable(sources, shards int) []Shard {
	out := make([]Shard, shards)
	for i := range out {
		process := harness.Watcher
		if i > 0 {
			process = fmt.Sprintf("%s-%d", harness.Watcher, i+1)
		}
		out[i] = Shard{Name: shardName(i), Process: process, Selector: shardSelector(i)}
	}
	for i := range sources {
		out[i%shards].Sources++
	}
	return out
}
