// Package fluxflags makes every Headwater role accept the command line of
// Flux's source-controller v1.9, so that the arguments and patches of an
// existing Flux installation keep working when Headwater replaces it.
//
// A role binds its own flags, then calls Bind: for each flag of Flux's
// (SourceController) that the role does not define under Flux's name,
// Bind registers Flux's name either as an alias of the role's flag of the
// same meaning (-concurrent for -concurrency, -log-encoding for
// -log-format, ...) or, when the role has none, as a flag that is
// accepted, checked as Flux checks it (a bad value is an error naming the
// flag) and has no effect; LogNoEffect says so once at start-up.
// -feature-gates takes Flux's gate names; an unknown gate is an error, as
// in Flux.
//
// Go's flag package reads both -name and --name, so Flux's double-dash
// arguments parse unchanged.
package fluxflags

import (
	"errors"
	"flag"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/go-logr/logr"
)

// kind is the type of a Flux flag's value, which decides what Bind
// accepts for a flag that has no effect.
type kind int

const (
	boolKind kind = iota
	intKind
	uint8Kind
	float32Kind
	durationKind
	stringKind
	stringSliceKind
	gatesKind
)

// Flag is one flag of Flux's source-controller.
type Flag struct {
	// Name is Flux's name for it.
	Name string
	// Default is Flux's default, as Flux's -help prints it.
	Default string
	// Usage is what the flag means in Flux.
	Usage string
	// Same are the Headwater flags that mean what Flux's flag means, in
	// order of preference: Bind makes Flux's name an alias of the first
	// the role defines.
	Same []string
	// NoEffect says why the flag does nothing in a role that defines
	// neither Flux's name nor one of Same.
	NoEffect string

	kind kind
}

// FeatureGate is one of the feature gates of Flux's source-controller.
type FeatureGate struct {
	// Name is Flux's name for it.
	Name string
	// Default is whether Flux enables it by default.
	Default bool
	// Effect says what it does in the roles that implement it (those
	// whose -feature-gates is a NewGates naming it); empty when none does.
	Effect string
	// NoEffect says why setting it does nothing in the other roles.
	NoEffect string
}

// ObjectLevelWorkloadIdentity is Flux's gate of object-level workload
// identity (fluxcd/pkg/auth's): a source's spec.serviceAccountName with a
// cloud provider, and -default-service-account.
const ObjectLevelWorkloadIdentity = "ObjectLevelWorkloadIdentity"

// FeatureGates are the gates Flux's source-controller v1.9 accepts in
// -feature-gates (its internal/features, and the one fluxcd/pkg/auth
// adds). A role implements those its NewGates names; every other gate is
// accepted and reported as having no effect; a name not listed is an
// error, as in Flux.
var FeatureGates = []FeatureGate{
	{Name: "CacheSecretsAndConfigMaps", Default: false,
		NoEffect: "the watcher reads no Secrets or ConfigMaps, and the fetcher reads a source's Secrets from the API server for each job"},
	{Name: ObjectLevelWorkloadIdentity, Default: false,
		Effect: "a source's spec.serviceAccountName with a cloud provider authenticates as that ServiceAccount (a token of it from the TokenRequest API exchanged with the cloud), and -default-service-account applies; " +
			"off, such a source stalls with Flux's FeatureGateDisabled",
		NoEffect: "only the fetcher gets cloud tokens for a source's ServiceAccount"},
}

// Reasons shared by several flags that have no effect.
const (
	noLeader  = "this role elects no leader: every replica takes its share of the jobs from the bus"
	noKube    = "this role does not talk to the Kubernetes API"
	noStorage = "this role keeps no artifacts (the fetchers, packagers and artifact-servers do)"
	notServer = "only the artifact-server serves artifacts"
	// noHelmCache: Flux's in-memory index cache serves HelmCharts.
	noHelmCache = "the fetcher keeps no parsed Helm repository indexes in memory: it keeps the few it downloaded last on disk for a minute and revalidates an index with the server (ETag)"
)

// SourceController are the flags of Flux's source-controller v1.9.1: its
// main.go and the option packages it binds (fluxcd/pkg/runtime's client,
// logger, leaderelection, features, controller and jitter, fluxcd/pkg/
// artifact's config and fluxcd/pkg/cache's token flags).
//
// Flux's -watch-all-namespaces and -watch-label-selector are the
// watcher's own flags, with their sharding meaning; the other roles
// accept them with no effect, as they serve every shard.
var SourceController = []Flag{
	{Name: "metrics-addr", Default: ":8080", Usage: "The address the metric endpoint binds to.",
		Same: []string{"telemetry-addr"}, NoEffect: "this role serves no metrics", kind: stringKind},
	{Name: "events-addr", Usage: "The address of the events receiver.",
		NoEffect: "only the watcher records Events, and posts them to its -events-addr", kind: stringKind},
	{Name: "health-addr", Default: ":9440", Usage: "The address the health endpoint binds to.",
		NoEffect: "this role serves /healthz and /readyz on -telemetry-addr (Flux's --metrics-addr)", kind: stringKind},
	{Name: "concurrent", Default: "2", Usage: "The number of concurrent reconciles per controller.",
		Same: []string{"concurrency"}, NoEffect: "this role has no pool of workers to size", kind: intKind},
	{Name: "helm-index-max-size", Default: "52428800", Usage: "The max allowed size in bytes of a Helm repository index file.",
		NoEffect: "only the fetcher downloads Helm repository indexes", kind: intKind},
	{Name: "helm-chart-max-size", Default: "10485760", Usage: "The max allowed size in bytes of a Helm chart file.",
		NoEffect: "only the fetcher downloads Helm charts", kind: intKind},
	{Name: "helm-chart-file-max-size", Default: "5242880", Usage: "The max allowed size in bytes of a file in a Helm chart.",
		NoEffect: "only the fetcher reads Helm charts", kind: intKind},
	{Name: "requeue-dependency", Default: "30s", Usage: "The interval at which failing dependencies are reevaluated.",
		NoEffect: "only the watcher requeues a source that waits for another", kind: durationKind},
	{Name: "helm-cache-max-size", Default: "0", Usage: "The maximum size of the cache in number of indexes.",
		NoEffect: noHelmCache, kind: intKind},
	{Name: "helm-cache-ttl", Default: "15m", Usage: "The TTL of an index in the cache.",
		NoEffect: noHelmCache, kind: durationKind},
	{Name: "helm-cache-purge-interval", Default: "1m", Usage: "The interval at which the cache is purged.",
		NoEffect: noHelmCache, kind: durationKind},
	{Name: "ssh-kex-algos", Usage: "The list of key exchange algorithms to use for ssh connections, arranged from most preferred to the least.",
		NoEffect: "the fetcher's SSH client offers the default key exchanges of Go's SSH library", kind: stringSliceKind},
	{Name: "ssh-hostkey-algos", Usage: "The list of hostkey algorithms to use for ssh connections, arranged from most preferred to the least.",
		NoEffect: "the fetcher's SSH client offers the algorithms of the keys the source's known_hosts holds for the host", kind: stringSliceKind},
	{Name: "default-service-account", Usage: "Default service account to use for workload identity when not specified in resources.",
		NoEffect: "only the fetcher gets cloud tokens for a source's ServiceAccount", kind: stringKind},
	{Name: "storage-path", Default: "/data", Usage: "The path to the directory where artifacts will be stored.",
		NoEffect: noStorage, kind: stringKind},
	{Name: "storage-addr", Default: ":9090", Usage: "The address the artifact server will bind to.",
		NoEffect: notServer, kind: stringKind},
	{Name: "storage-adv-addr", Usage: "The in-cluster address the artifact server will advertise to clients.",
		NoEffect: notServer, kind: stringKind},
	{Name: "artifact-retention-ttl", Default: "1m0s", Usage: "The duration after which stale artifacts are garbage collected.",
		NoEffect: "only the packager garbage-collects artifacts", kind: durationKind},
	{Name: "artifact-retention-records", Default: "2", Usage: "The maximum number of artifacts to be kept in storage after a garbage collection.",
		NoEffect: "only the packager garbage-collects artifacts", kind: intKind},
	{Name: "artifact-digest-algo", Default: "sha256", Usage: "The hashing algorithm used to calculate the digest of artifacts.",
		NoEffect: "only the packager computes artifacts' digests", kind: stringKind},
	{Name: "kube-api-qps", Default: "50", Usage: "The maximum queries-per-second of requests sent to the Kubernetes API.",
		NoEffect: noKube, kind: float32Kind},
	{Name: "kube-api-burst", Default: "300", Usage: "The maximum burst queries-per-second of requests sent to the Kubernetes API.",
		NoEffect: noKube, kind: intKind},
	{Name: "log-encoding", Default: "json", Usage: "Log encoding format. Can be 'json' or 'console'.",
		Same: []string{"log-format"}, NoEffect: "this role writes no logs", kind: stringKind},
	{Name: "log-level", Default: "info", Usage: "Log verbosity level. Can be one of 'trace', 'debug', 'info', 'error'.",
		NoEffect: "this role writes no logs", kind: stringKind},
	{Name: "enable-leader-election", Default: "false", Usage: "Enable leader election for controller manager.",
		Same: []string{"leader-elect"}, NoEffect: noLeader, kind: boolKind},
	{Name: "leader-election-release-on-cancel", Default: "true", Usage: "Defines if the leader should step down voluntarily on controller manager shutdown.",
		NoEffect: noLeader, kind: boolKind},
	{Name: "leader-election-lease-duration", Default: "35s", Usage: "Interval at which non-leader candidates will wait to force acquire leadership.",
		NoEffect: noLeader, kind: durationKind},
	{Name: "leader-election-renew-deadline", Default: "30s", Usage: "Duration that the leading controller manager will retry refreshing leadership before giving up.",
		NoEffect: noLeader, kind: durationKind},
	{Name: "leader-election-retry-period", Default: "5s", Usage: "Duration the LeaderElector clients should wait between tries of actions.",
		NoEffect: noLeader, kind: durationKind},
	{Name: "min-retry-delay", Default: "750ms", Usage: "The minimum amount of time for which an object being reconciled will have to wait before a retry.",
		NoEffect: "only the watcher schedules the retries of failed reconciles", kind: durationKind},
	{Name: "max-retry-delay", Default: "15m0s", Usage: "The maximum amount of time for which an object being reconciled will have to wait before a retry.",
		NoEffect: "only the watcher schedules the retries of failed reconciles", kind: durationKind},
	{Name: "feature-gates", Usage: "A comma separated list of key=value pairs defining the state of experimental features.",
		NoEffect: featureGatesNoEffect, kind: gatesKind},
	{Name: "watch-configs-label-selector", Default: "toolkit.fluxcd.io/watch=enabled", Usage: "Watch for ConfigMaps and Secrets with matching labels.",
		NoEffect: "Headwater does not watch Secrets or ConfigMaps: a changed Secret is read at the source's next fetch", kind: stringKind},
	{Name: "interval-jitter-percentage", Default: "5", Usage: "Percentage of jitter to apply to interval durations.",
		NoEffect: "only the watcher schedules reconciles", kind: uint8Kind},
	{Name: "watch-all-namespaces", Default: "true", Usage: "Watch for custom resources in all namespaces, if set to false it will only watch the runtime namespace.",
		NoEffect: "only the watcher chooses the sources it reconciles; this role serves every watcher's jobs", kind: boolKind},
	{Name: "watch-label-selector", Usage: "Watch for resources with matching labels e.g. 'sharding.fluxcd.io/shard=shard1'.",
		NoEffect: "only the watcher chooses the sources it reconciles (its shard); this role serves every shard's jobs", kind: stringKind},
	{Name: "token-cache-max-size", Default: "100", Usage: "The maximum size of the cache in number of tokens.",
		NoEffect: "only the fetchers get tokens from cloud and Git providers", kind: intKind},
	{Name: "token-cache-max-duration", Default: "1h0m0s", Usage: "The maximum duration a token is cached.",
		NoEffect: "only the fetchers get tokens from cloud and Git providers", kind: durationKind},
}

// Bind registers on fs, after the role's own flags, every flag of
// SourceController that fs does not define: as an alias of the first of
// its Same that fs defines, or else as a flag with no effect, reported
// by LogNoEffect. A flag fs defines under Flux's name is the role's own,
// with Flux's meaning.
func Bind(fs *flag.FlagSet) {
	for _, f := range SourceController {
		if fs.Lookup(f.Name) != nil {
			continue
		}
		if target := firstDefined(fs, f.Same); target != nil {
			fs.Var(&alias{Value: target.Value, target: target.Name}, f.Name,
				fmt.Sprintf("Flux's name for -%s.", target.Name))
			continue
		}
		var v flag.Value = &noEffect{kind: f.kind, reason: f.NoEffect, value: f.Default}
		if f.kind == gatesKind {
			v = &Gates{}
		}
		fs.Var(v, f.Name, "Flux's flag, accepted with no effect here: "+f.NoEffect+". In Flux: "+f.Usage)
	}
}

func firstDefined(fs *flag.FlagSet, names []string) *flag.Flag {
	for _, n := range names {
		if f := fs.Lookup(n); f != nil {
			return f
		}
	}
	return nil
}

// alias is Flux's name for a Headwater flag: it sets the flag's own
// value.
type alias struct {
	flag.Value
	target string
}

// AliasOf names the flag a is an alias of (see package flagenv: an alias
// is read from the environment under its target's name only).
func (a *alias) AliasOf() string { return a.target }

// IsBoolFlag lets -enable-leader-election stand alone, as its target.
func (a *alias) IsBoolFlag() bool {
	b, ok := a.Value.(interface{ IsBoolFlag() bool })
	return ok && b.IsBoolFlag()
}

// String is the target's value; the zero alias, which the flag package
// makes to print defaults, has none.
func (a *alias) String() string {
	if a == nil || a.Value == nil {
		return ""
	}
	return a.Value.String()
}

// noEffect is a Flux flag a role accepts and ignores, once its value is
// checked as Flux checks it.
type noEffect struct {
	kind   kind
	reason string
	value  string
}

// String is the value last set, or Flux's default.
func (v *noEffect) String() string {
	if v == nil {
		return ""
	}
	return v.value
}

// IsBoolFlag lets a boolean flag of Flux's stand alone.
func (v *noEffect) IsBoolFlag() bool { return v.kind == boolKind }

// Set checks s as Flux parses a flag of its kind.
func (v *noEffect) Set(s string) error {
	var err error
	switch v.kind {
	case boolKind:
		_, err = strconv.ParseBool(s)
	case intKind:
		_, err = strconv.ParseInt(s, 0, 64)
	case uint8Kind:
		_, err = strconv.ParseUint(s, 0, 8)
	case float32Kind:
		_, err = strconv.ParseFloat(s, 32)
	case durationKind:
		_, err = time.ParseDuration(s)
	}
	if err != nil {
		return errors.New("parse error")
	}
	v.value = s
	return nil
}

// Gates is Flux's -feature-gates: comma-separated name=bool pairs, each
// name one of FeatureGates. A role that implements gates binds its own
// (NewGates) as -feature-gates; Bind gives the others one that implements
// none.
type Gates struct {
	set       map[string]bool
	effective []string
}

// NewGates returns the -feature-gates of a role that implements the gates
// named effective; the others are accepted with no effect.
func NewGates(effective ...string) *Gates {
	return &Gates{effective: effective}
}

// Enabled reports whether gate is on: as set, else Flux's default.
func (g *Gates) Enabled(gate string) bool {
	if v, ok := g.set[gate]; ok {
		return v
	}
	for _, f := range FeatureGates {
		if f.Name == gate {
			return f.Default
		}
	}
	return false
}

// String lists the gates set, in name order.
func (g *Gates) String() string {
	if g == nil {
		return ""
	}
	var pairs []string
	for _, name := range slices.Sorted(maps.Keys(g.set)) {
		pairs = append(pairs, name+"="+strconv.FormatBool(g.set[name]))
	}
	return strings.Join(pairs, ",")
}

// Set reads name=bool pairs, as Flux (k8s.io/component-base's
// MapStringBool): a repeated flag adds to the gates set before, and a
// gate Flux's source-controller does not know is an error.
func (g *Gates) Set(s string) error {
	if g.set == nil {
		g.set = map[string]bool{}
	}
	for pair := range strings.SplitSeq(s, ",") {
		pair = strings.TrimSpace(pair)
		if pair == "" {
			continue
		}
		name, value, ok := strings.Cut(pair, "=")
		if !ok {
			return fmt.Errorf("missing bool value for %s", pair)
		}
		name = strings.TrimSpace(name)
		if !slices.ContainsFunc(FeatureGates, func(f FeatureGate) bool { return f.Name == name }) {
			return fmt.Errorf("feature-gate '%s' not supported (Flux's source-controller knows %s)", name, gateNames())
		}
		b, err := strconv.ParseBool(strings.TrimSpace(value))
		if err != nil {
			return fmt.Errorf("invalid value of %s: %s", name, strings.TrimSpace(value))
		}
		g.set[name] = b
	}
	return nil
}

func gateNames() string {
	names := make([]string, len(FeatureGates))
	for i, f := range FeatureGates {
		names[i] = f.Name
	}
	return strings.Join(names, ", ")
}

// LogNoEffect logs, once per flag, each flag of fs set (on the command
// line or from the environment) that has no effect in this role, and each
// feature gate set that the role does not implement: what it is and why
// it does nothing.
func LogNoEffect(fs *flag.FlagSet, log logr.Logger) {
	fs.Visit(func(f *flag.Flag) {
		switch v := f.Value.(type) {
		case *noEffect:
			log.Info("flag has no effect in Headwater", "flag", f.Name, "value", v.value, "reason", v.reason)
		case *Gates:
			for _, g := range FeatureGates {
				if enabled, ok := v.set[g.Name]; ok && !slices.Contains(v.effective, g.Name) {
					log.Info("feature gate has no effect in Headwater", "flag", f.Name, "gate", g.Name, "enabled", enabled, "reason", g.NoEffect)
				}
			}
		}
	})
}
