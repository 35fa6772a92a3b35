package events

import (
	"slices"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// FlightBucket is the JetStream key-value bucket in which fetcher replicas
// combine fetches of the same content: the first to fetch a content key
// creates its entry (a lease it refreshes while it fetches), the others
// watch the entry until the leader's staged content lands in it, then copy
// that content instead of fetching. Only the fetcher identity may use it
// (see Permissions, and docs/design.md, "Combining fetches across
// replicas").
const FlightBucket = "HEADWATER_FLIGHTS"

// FlightTTL is how long an entry of FlightBucket lives after its last
// write: the leader of a fetch rewrites its lease well within it, so the
// lease of a leader that died expires after FlightTTL, and a landed
// entry, which no one rewrites, is offered to late fetches for as long.
const FlightTTL = 20 * time.Second

// HostBucket is the JetStream key-value bucket in which fetcher replicas
// share what they know of each upstream host: until when it asked to be
// left alone (a 429 or 503 with Retry-After), and its token bucket (GCRA's
// theoretical arrival time), one key per host, written with
// compare-and-set. Only the fetcher identity may use it (see Permissions,
// and docs/design.md, "Polite to upstreams").
const HostBucket = "HEADWATER_HOSTS"

// HostTTL is how long an entry of HostBucket lives after its last write:
// longer than the longest hold (10 minutes) and than any token bucket's
// reach ahead, so an entry that expires says nothing anyone still needs.
const HostTTL = 15 * time.Minute

// OrderBucket is the JetStream key-value bucket in which the watcher
// keeps, for each source (keyed by its UID), when the newest job whose
// outcome it wrote into the source's status was requested, so that a new
// leader, or the shard a source moved to, does not write the outcome of
// an older job that arrives late (a fetcher or packager cut off from the
// bus that finishes once it is back). The leader keeps the same in
// memory and reads an entry once per source. Only the watcher identity
// may use it (see Permissions, and docs/design.md, "Outcomes are written
// in job order").
const OrderBucket = "HEADWATER_OUTCOME_ORDER"

// OrderTTL is how long an entry of OrderBucket lives after its last
// write. Every source's outcome is written at least once an announce
// interval (10 minutes by default) and a job's outcome comes within its
// deadline, unless its worker was cut off: a day covers a node lost for
// hours; an entry that expires only lets such a late outcome through
// after a leader change, as before the bucket.
const OrderTTL = 24 * time.Hour

// Buckets returns the configuration of every key-value bucket Headwater
// uses, kept in replicas copies as the streams are (see Streams).
func Buckets(replicas int) []jetstream.KeyValueConfig {
	return []jetstream.KeyValueConfig{{
		Bucket:      FlightBucket,
		Description: "Headwater fetches in flight, by content key, shared by the fetcher replicas",
		History:     1,
		TTL:         FlightTTL,
		// Expiry leaves a marker that watchers see, so a follower learns
		// at once that a lease expired; the marker goes after FlightTTL.
		LimitMarkerTTL: FlightTTL,
		// An entry holds a Fetched job, which is small.
		MaxValueSize: 256 << 10,
		// A lease lives seconds and losing it costs one duplicate
		// download (a restarted NATS server forgets the fetches in
		// flight, whose fetchers then fetch on their own): in memory it
		// costs NATS no disk write, where every distinct content key
		// writes an entry twice.
		Storage:  jetstream.MemoryStorage,
		Replicas: max(replicas, 1),
	}, {
		Bucket:      HostBucket,
		Description: "Headwater's upstream hosts: holds asked for with Retry-After and token buckets, shared by the fetcher replicas",
		History:     1,
		TTL:         HostTTL,
		// An entry is two timestamps.
		MaxValueSize: 1 << 10,
		// Every request to a limited host writes its entry: in memory it
		// costs NATS no disk write. A restarted NATS server forgets the
		// holds and the buckets, and the next 429 teaches them again.
		Storage:  jetstream.MemoryStorage,
		Replicas: max(replicas, 1),
	}, {
		Bucket:      OrderBucket,
		Description: "Headwater's outcome order: when each source's newest job whose outcome the watcher wrote was requested",
		History:     1,
		TTL:         OrderTTL,
		// An entry is one timestamp.
		MaxValueSize: 256,
		// Every outcome written writes its source's entry. In memory it
		// costs NATS no disk write, and the replicas keep it through a
		// server's restart; a whole NATS cluster restarted forgets the
		// order, which the leader keeps in memory as well.
		Storage:  jetstream.MemoryStorage,
		Replicas: max(replicas, 1),
	}}
}

// BucketStream is the name of the stream that holds a key-value bucket.
func BucketStream(bucket string) string { return "KV_" + bucket }

// BucketOwner returns the identity that uses a bucket, which alone may
// create, update and use it.
func BucketOwner(bucket string) string {
	for _, id := range Identities() {
		r, _ := roleOf(id)
		if slices.Contains(r.buckets, bucket) {
			return id
		}
	}
	return ""
}
