// Package role is the fetcher's main (Main), importable so that the fetcher
// command and the headwater command (headwater -target=fetcher) run the same
// service; the fetcher command's documentation says what it does.
package role

import (
	"context"
	"flag"
	"os"
	"path/filepath"
	"time"

	"github.com/go-logr/logr"

	"github.com/headwater-gitops/headwater/pkg/bus"
	"github.com/headwater-gitops/headwater/pkg/command"
	"github.com/headwater-gitops/headwater/pkg/egress"
	"github.com/headwater-gitops/headwater/pkg/events"
	"github.com/headwater-gitops/headwater/pkg/fluxflags"
	"github.com/headwater-gitops/headwater/pkg/storage"
	"github.com/headwater-gitops/headwater/pkg/telemetry"
	"github.com/headwater-gitops/headwater/services/fetcher/internal/bucketfetch"
	"github.com/headwater-gitops/headwater/services/fetcher/internal/gitfetch"
	"github.com/headwater-gitops/headwater/services/fetcher/internal/helmchartfetch"
	"github.com/headwater-gitops/headwater/services/fetcher/internal/helmfetch"
	"github.com/headwater-gitops/headwater/services/fetcher/internal/hostlimit"
	"github.com/headwater-gitops/headwater/services/fetcher/internal/providertoken"
	"github.com/headwater-gitops/headwater/services/fetcher/internal/secrets"
)

// service names the fetcher on the bus, in logs and in metrics.
const service = "fetcher"

// options are the fetcher's flags; every flag can also be set from
// HEADWATER_<FLAG> (see package flagenv).
type options struct {
	bus bus.Options
	// egress is the policy of the addresses sources' URLs may reach.
	egress      egress.Options
	storage     storage.Options
	telemetry   telemetry.Options
	secrets     secrets.Options
	concurrency int
	maxAttempts int
	maxFileSize int64
	// jobTimeout is the least deadline of a job (fetch.Handler.JobTimeout).
	jobTimeout time.Duration
	// maxJobTimeout is the most deadline of a job, whatever its source's
	// spec.timeout asks (a tenant's choice): see jobDeadline.
	maxJobTimeout time.Duration
	// bucketConcurrency bounds the objects of one Bucket downloaded at once.
	bucketConcurrency int
	// refCacheTTL is how long a Git remote's reference listing is shared.
	refCacheTTL time.Duration
	// tokenCacheSize bounds the provider access tokens kept; 0 keeps none.
	tokenCacheSize int
	// tokenCacheMaxDuration bounds how long a provider token is reused.
	tokenCacheMaxDuration time.Duration
	// contentCache reuses the artifacts of identical content.
	contentCache bool
	// verifyInterval is how long a verified stored artifact is trusted.
	verifyInterval time.Duration
	// helmIndexMaxSize bounds a Helm repository index.
	helmIndexMaxSize int64
	// helmChartMaxSize bounds a chart archive, helmChartFileMaxSize a file
	// in it.
	helmChartMaxSize, helmChartFileMaxSize int64
	// workDir holds the run directories of the fetcher processes that
	// share it (see package workdir).
	workDir string
	// rateLimits are the per-host token buckets (see package hostlimit).
	rateLimits string
	// rateLimitMaxWait bounds a request's wait for its host's bucket.
	rateLimitMaxWait time.Duration
	// gates are Flux's -feature-gates; the fetcher implements
	// ObjectLevelWorkloadIdentity.
	gates *fluxflags.Gates
	// defaultServiceAccount is Flux's -default-service-account.
	defaultServiceAccount string
}

func (o *options) bindFlags(fs *flag.FlagSet) {
	o.bus.BindFlags(fs)
	o.egress.BindFlags(fs)
	o.storage.BindFlags(fs)
	o.telemetry.BindFlags(fs, ":9101")
	o.secrets.BindFlags(fs)
	fs.StringVar(&o.workDir, "work-dir", filepath.Join(os.TempDir(), "headwater-fetcher"),
		"Directory for the scratch data of jobs (clones, downloads); a process works in a directory of its own in it and, starting, removes those of processes that died.")
	fs.IntVar(&o.concurrency, "concurrency", 4, "Jobs handled at once; the fetcher pulls a job from the bus only for a free worker.")
	fs.IntVar(&o.maxAttempts, "max-attempts", events.DefaultMaxDeliver, "Attempts of a job that keeps failing transiently before its failure is final.")
	fs.DurationVar(&o.jobTimeout, "job-timeout", bus.DefaultJobTimeout,
		"The least deadline of one job; a source whose spec.timeout is longer has that plus a minute, up to -max-job-timeout. Past it the job fails with DeadlineExceeded and its slot serves the next.")
	fs.DurationVar(&o.maxJobTimeout, "max-job-timeout", DefaultMaxJobTimeout,
		"The longest deadline of one job, whatever its source's spec.timeout (which a tenant chooses): a fetch still running then fails with DeadlineExceeded and its slot serves the next.")
	fs.Int64Var(&o.maxFileSize, "max-file-size", 0, "Largest file a source may contain, in bytes; 0 means no limit.")
	fs.IntVar(&o.bucketConcurrency, "bucket-concurrency", bucketfetch.DefaultConcurrency, "Objects of one Bucket downloaded at once.")
	fs.DurationVar(&o.refCacheTTL, "ref-cache-ttl", gitfetch.DefaultRefCacheTTL,
		"How long a Git remote's reference listing answers other fetches of the same remote with the same credentials; 0 disables sharing.")
	fs.IntVar(&o.tokenCacheSize, "token-cache-max-size", providertoken.DefaultCacheEntries,
		"Most access tokens and registry logins of providers (GitHub App installations, the fetcher's AWS, Azure and GCP identities) kept until shortly before they expire, as Flux's flag of that name; 0 mints a token for every fetch.")
	fs.DurationVar(&o.tokenCacheMaxDuration, "token-cache-max-duration", providertoken.DefaultMaxDuration,
		"Longest a cached provider token or registry login is reused, whatever its lifetime (it is renewed after 80% of its lifetime in any case), as Flux's flag of that name.")
	fs.DurationVar(&o.verifyInterval, "artifact-verify-interval", storage.DefaultVerifyInterval,
		"How long an unchanged reconcile trusts a stored artifact this fetcher read and found intact, while storage reports the same size and modification time (ETag); 0 reads it through on every reconcile, as Flux.")
	fs.BoolVar(&o.contentCache, "content-cache", true,
		"Reuse the stored artifact of identical content (same upstream, revision and content-affecting spec) instead of fetching it again, and combine identical fetches in flight across the fetcher replicas.")
	fs.Int64Var(&o.helmIndexMaxSize, "helm-index-max-size", helmfetch.DefaultMaxIndexSize, "Largest Helm repository index fetched, in bytes.")
	fs.Int64Var(&o.helmChartMaxSize, "helm-chart-max-size", helmchartfetch.DefaultMaxChartSize, "Largest Helm chart archive fetched, in bytes.")
	fs.StringVar(&o.rateLimits, "rate-limits", hostlimit.DefaultRules,
		"Requests per second and burst allowed per upstream host, shared by every fetcher replica, as comma-separated host=rate/burst; "+
			"a host is matched by name (with or without port) or shell pattern (*.example.com), the first match applies, * matches every host, a rate of 0 sets no limit. "+
			"A host that answers 429 or 503 with Retry-After is left alone until then whatever its limit.")
	fs.DurationVar(&o.rateLimitMaxWait, "rate-limit-max-wait", hostlimit.DefaultMaxWait,
		"Longest a request waits for a slot of its host's rate limit; longer, and the fetch answers that the source is rate limited, with when to try again.")
	fs.Int64Var(&o.helmChartFileMaxSize, "helm-chart-file-max-size", helmchartfetch.DefaultMaxChartFileSize,
		"Largest file in a Helm chart, decompressed, in bytes.")
	o.gates = fluxflags.NewGates(fluxflags.ObjectLevelWorkloadIdentity)
	fs.Var(o.gates, "feature-gates",
		"Flux's feature gates, comma-separated Name=true|false. ObjectLevelWorkloadIdentity=true lets a source's spec.serviceAccountName with a cloud provider authenticate as that ServiceAccount "+
			"(needs RBAC create on serviceaccounts/token: the workload-identity component); Flux's other gates are accepted with no effect.")
	fs.StringVar(&o.defaultServiceAccount, "default-service-account", "",
		"ServiceAccount of a source's own namespace that sources with a cloud provider and no spec.serviceAccountName authenticate as (Flux's multi-tenancy lockdown); needs -feature-gates=ObjectLevelWorkloadIdentity=true.")
}

// Flags returns the role's flags as Main parses them (command.NewFlagSet),
// bound to options of their own: for tests and the flag reference
// (docs/flags.md).
func Flags() *flag.FlagSet {
	var o options
	return command.NewFlagSet(service, o.bindFlags)
}

// Main runs the fetcher with args, the command line after the program's
// name (or after -target), and exits the process when it ends.
func Main(args []string) {
	var o options
	command.MainArgs(service, args, o.bindFlags, func() logr.Logger { return o.telemetry.NewLogger(service) },
		func(ctx context.Context) error { return run(ctx, o) })
}
