package events

import (
	"encoding/json"
	"time"

	"github.com/fluxcd/pkg/apis/meta"
	sourcev1 "github.com/fluxcd/source-controller/api/v1"
	swv1beta1 "github.com/fluxcd/source-watcher/api/v2/v1beta1"
)

// ObjectRef names the Kubernetes object a job is for. UID and Generation pin
// the exact object and spec the job was made from, so a result for a deleted
// and re-created object, or for an older spec, is recognised as such.
type ObjectRef struct {
	// Kind is the resource kind, e.g. "GitRepository".
	Kind string `json:"kind"`
	// Namespace and Name identify the object.
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	// UID is the object's metadata.uid.
	UID string `json:"uid"`
	// Generation is the metadata.generation the job was made from.
	Generation int64 `json:"generation"`
	// Labels are the object's metadata.labels when the job was made, so
	// that subscribers can select sources by label (a Subscription's
	// spec.sources.labelSelector). Added in v1 as an optional field.
	Labels map[string]string `json:"labels,omitempty"`
}

// Job identifies one reconcile of one source as it moves through the
// pipeline; every message derived from a job carries it unchanged.
type Job struct {
	// ID is deterministic for a given object, generation and trigger, and is
	// the JetStream message ID of the request, so a repeated request within
	// the stream's duplicate window never makes a second job.
	ID string `json:"id"`
	// Object is the source the job is for.
	Object ObjectRef `json:"object"`
	// ReconcileToken is the value of the reconcile.fluxcd.io/requestedAt
	// annotation the job handles, empty when none; the watcher copies it to
	// status.lastHandledReconcileAt when the job's outcome arrives.
	ReconcileToken string `json:"reconcileToken,omitempty"`
	// RequestedAt is when the watcher made the job.
	RequestedAt time.Time `json:"requestedAt"`
	// Seal proves the watcher issued the job: an HMAC of the fields above
	// with a key only the watcher holds. Other services carry it
	// unchanged; the watcher applies no outcome whose job's seal does not
	// check out.
	Seal string `json:"seal,omitempty"`
}

// FetchRequested is the data of TypeFetchRequested: fetch one source.
// Exactly one of the spec fields is set, matching Job.Object.Kind. Specs name
// Secrets; they never contain credentials.
type FetchRequested struct {
	Job Job `json:"job"`
	// GitRepository is the spec of a GitRepository.
	GitRepository *sourcev1.GitRepositorySpec `json:"gitRepository,omitempty"`
	// Bucket is the spec of a Bucket.
	Bucket *sourcev1.BucketSpec `json:"bucket,omitempty"`
	// OCIRepository is the spec of an OCIRepository.
	OCIRepository *sourcev1.OCIRepositorySpec `json:"ociRepository,omitempty"`
	// HelmRepository is the spec of a HelmRepository (type default; an OCI
	// HelmRepository has no artifact and makes no job).
	HelmRepository *sourcev1.HelmRepositorySpec `json:"helmRepository,omitempty"`
	// HelmChart is the spec of a HelmChart; ChartSource is its source.
	HelmChart *sourcev1.HelmChartSpec `json:"helmChart,omitempty"`
	// ChartSource is the source a HelmChart's chart comes from, resolved
	// by the watcher; set with HelmChart.
	ChartSource *ChartSource `json:"chartSource,omitempty"`
	// Plugin is the spec of a source of a plug-in kind (docs/
	// writing-a-source-kind.md): a kind the watcher reconciles from its
	// registration alone, fetched by a process of its own. Added in v1 as
	// an optional field: the built-in kinds never set it.
	Plugin *PluginSpec `json:"plugin,omitempty"`
	// Previous is the artifact recorded in the object's status, if any. The
	// fetcher answers FetchUnchanged when the upstream revision equals its
	// revision and the stored file is intact.
	Previous *meta.Artifact `json:"previous,omitempty"`
	// Force asks for a fresh fetch and artifact even when the revision is
	// unchanged, because a content-affecting part of the spec changed.
	Force bool `json:"force,omitempty"`
	// Quiet says the source is steady: Ready, its generation observed, no
	// reconcile request pending, its artifact's URL current. Its outcome
	// matters only if something changed, so a fetch that finds the
	// upstream revision unchanged and the stored artifact intact publishes
	// nothing: one bus message per steady reconcile, the job. The watcher
	// leaves it unset at least once every announce interval per source
	// (the artifact.unchanged cadence, docs/events.md). Added in v1 as an
	// optional field: a fetcher that ignores it publishes FetchUnchanged,
	// as before.
	Quiet bool `json:"quiet,omitempty"`
	// Fresh asks for the upstream as it is now: no reference listing made
	// before the job was requested may answer it (a webhook said the
	// upstream changed).
	Fresh bool `json:"fresh,omitempty"`
	// Includes are the artifacts of other sources to copy into this one's
	// (a GitRepository's spec.include), resolved by the watcher to the
	// artifacts those sources have now. Their digests are part of what the
	// stored artifact was built from: a change of any of them forces a
	// rebuild.
	Includes []Include `json:"includes,omitempty"`
}

// Spec returns the spec the request carries for its kind (a
// *sourcev1.GitRepositorySpec, ...), or nil when it carries none.
func (r *FetchRequested) Spec() any {
	switch {
	case r.GitRepository != nil:
		return r.GitRepository
	case r.Bucket != nil:
		return r.Bucket
	case r.OCIRepository != nil:
		return r.OCIRepository
	case r.HelmRepository != nil:
		return r.HelmRepository
	case r.HelmChart != nil:
		return r.HelmChart
	case r.Plugin != nil:
		return r.Plugin.Spec
	}
	return nil
}

// PluginSpec is what a fetch job of a plug-in kind carries: the object's
// API version and kind, and its whole spec as the API server holds it.
// The spec names Secrets; the watcher refuses none of it, so a plug-in
// kind's schema must not hold credentials (its fetcher reads them from the
// Secrets it names, as the built-in fetchers do).
type PluginSpec struct {
	// APIVersion is the object's group/version, e.g.
	// "source.headwater.dev/v1alpha1".
	APIVersion string `json:"apiVersion"`
	// Kind is the object's kind, e.g. "HTTPSource"; Job.Object.Kind too.
	Kind string `json:"kind"`
	// Spec is the object's spec, as JSON.
	Spec json.RawMessage `json:"spec"`
}

// Include is one artifact of another source to copy into an artifact.
type Include struct {
	// Name of the included GitRepository (same namespace).
	Name string `json:"name"`
	// Artifact is the included source's artifact, read from storage by
	// Artifact.Path.
	Artifact meta.Artifact `json:"artifact"`
	// FromPath is the directory of the included artifact to copy; empty
	// means all of it.
	FromPath string `json:"fromPath,omitempty"`
	// ToPath is where the copy goes in this artifact; never empty (Flux
	// defaults it to the included source's name).
	ToPath string `json:"toPath"`
}

// ChartSource is the object a HelmChart's spec.sourceRef names, as the
// watcher found it.
type ChartSource struct {
	// Kind and Name of the source (same namespace as the HelmChart).
	Kind string `json:"kind"`
	Name string `json:"name"`
	// Artifact is the source's artifact: a HelmRepository's index, a
	// GitRepository's or Bucket's tarball.
	Artifact meta.Artifact `json:"artifact"`
	// HelmRepository is the spec of a HelmRepository source: where charts
	// are downloaded from and the Secrets to download them with.
	HelmRepository *sourcev1.HelmRepositorySpec `json:"helmRepository,omitempty"`
	// Repositories are the HelmRepositories of the HelmChart's namespace
	// (type default with an index, and type oci), for the dependencies of
	// a chart from a GitRepository or a Bucket: a dependency's repository
	// URL is looked up among them, for its index and credentials (an OCI
	// one's credentials only).
	Repositories []ChartRepository `json:"repositories,omitempty"`
}

// ChartRepository is a HelmRepository a chart's dependencies may come from.
type ChartRepository struct {
	// Name of the HelmRepository.
	Name string `json:"name"`
	// Spec is its spec (URL, Secrets).
	Spec sourcev1.HelmRepositorySpec `json:"spec"`
	// Artifact is its stored index (none for an OCI HelmRepository).
	Artifact meta.Artifact `json:"artifact"`
}

// Verification is the result of checking a source's signatures (a
// GitRepository's spec.verify), for the SourceVerified condition.
type Verification struct {
	// Mode is what was verified: "HEAD", "Tag" or "TagAndHEAD".
	Mode string `json:"mode"`
	// Verified is true when every required signature checked out.
	Verified bool `json:"verified"`
	// Reason and Message of the SourceVerified condition, in Flux's words
	// (e.g. Succeeded, "verified signature of commit '<hash>' with key
	// '<fingerprint>'", or VerificationError and why).
	Reason  string `json:"reason"`
	Message string `json:"message"`
}

// DeletionJobID is the ID of the job that removes every artifact of the
// deleted object with the given UID: one per object, so a finalizer that
// runs twice makes one job.
func DeletionJobID(uid string) string { return uid + "/delete" }

// DeleteRequested is the data of TypeDeleteRequested: remove every artifact
// of a source that was deleted.
type DeleteRequested struct {
	Job Job `json:"job"`
}

// Fetched is the data of TypeFetched: content is staged for packaging.
type Fetched struct {
	Job Job `json:"job"`
	// Revision is the upstream revision in Flux's format, e.g.
	// "main@sha1:<commit>" or "sha256:<hex>".
	Revision string `json:"revision"`
	// Staging is the storage key of the staged content: an uncompressed tar
	// stream in canonical entry order (see package archive), already
	// filtered by the source's ignore rules.
	Staging string `json:"staging"`
	// ArtifactName is the file name the artifact is stored under in the
	// source's directory, e.g. "<commit>.tar.gz".
	ArtifactName string `json:"artifactName"`
	// Metadata is the artifact's metadata (Flux's artifact.metadata: an
	// OCI artifact's manifest annotations), if any.
	Metadata map[string]string `json:"metadata,omitempty"`
	// Format says what is staged: FormatTree (the default, an
	// uncompressed tar of a tree the packager canonicalises) or
	// FormatFile (the artifact's bytes, stored as they are).
	Format StagedFormat `json:"format,omitempty"`
	// EventMessage is the message of the NewArtifact Kubernetes Event, in
	// Flux's words (e.g. "stored artifact for commit 'Add README'").
	EventMessage string `json:"eventMessage,omitempty"`
	// Notices are things the fetcher noticed on the way that the watcher
	// reports as Events, e.g. a corrupted artifact that is being rebuilt.
	Notices []Notice `json:"notices,omitempty"`
	// Includes are copied from the request: the packager adds them to the
	// artifact.
	Includes []Include `json:"includes,omitempty"`
	// Verification is the result of spec.verify, when it is set.
	Verification *Verification `json:"verification,omitempty"`
	// ContentKey, when set, identifies the artifact's content: the hex
	// SHA-256 of everything that determines its bytes (kind, upstream,
	// revision, content-affecting spec, includes, limits). The packager
	// records the artifact it stores in the content cache under this key,
	// so the next source with the same key reuses it instead of fetching.
	ContentKey string `json:"contentKey,omitempty"`
	// Reuse, when set, says the content was not fetched: the artifact is a
	// copy of the cached one it names, and nothing is staged at Staging.
	Reuse *Reuse `json:"reuse,omitempty"`
}

// StagedFormat is what a Fetched job's staged content is.
type StagedFormat string

const (
	// FormatTree is an uncompressed tar of a tree, in canonical order: the
	// packager merges the includes into it and writes the canonical
	// tar.gz (a Git checkout, a Bucket's objects, an extracted OCI layer).
	FormatTree StagedFormat = ""
	// FormatFile is the artifact itself, stored unchanged with its
	// digest (a Helm chart .tgz, a Helm repository index, an OCI layer
	// copied as is). It takes no includes.
	FormatFile StagedFormat = "file"
)

// Reuse names a cached artifact with the content a Fetched job needs,
// found by the job's ContentKey.
type Reuse struct {
	// Key is the storage key of the cached artifact (an internal key).
	Key string `json:"key"`
	// Digest is its digest in "<algorithm>:<hex>" form, as recorded when it
	// was stored.
	Digest string `json:"digest"`
	// Size is its size in bytes.
	Size int64 `json:"size"`
}

// Outcome is the data of every result type (TypeFetchUnchanged,
// TypeFetchFailed, TypePackaged, TypePackageFailed, TypeDeleted) and of every
// public type (TypeArtifactStored, ...): what a job ended with.
type Outcome struct {
	Job Job `json:"job"`
	// Revision is the upstream revision observed, when one was.
	Revision string `json:"revision,omitempty"`
	// Artifact is the artifact now stored for the source: the new one for
	// stored, the existing one for unchanged. URL is filled in by the
	// artifact-server.
	Artifact *meta.Artifact `json:"artifact,omitempty"`
	// EventMessage is the message for the Kubernetes Event the outcome
	// deserves (NewArtifact for a new artifact), in Flux's words.
	EventMessage string `json:"eventMessage,omitempty"`
	// Failure is set for failed outcomes.
	Failure *Failure `json:"failure,omitempty"`
	// Notices are carried over from the job's earlier stages.
	Notices []Notice `json:"notices,omitempty"`
	// IncludedArtifacts are the artifacts of the Includes the stored
	// artifact was built with (Flux's status.includedArtifacts).
	IncludedArtifacts []*meta.Artifact `json:"includedArtifacts,omitempty"`
	// Verification is the result of spec.verify, when it is set; it is also
	// set on a failure when verification is what failed.
	Verification *Verification `json:"verification,omitempty"`
	// Outputs are the artifacts of an ArtifactGenerator's job (a
	// TypeGenerateRequested), one per output, in spec order; URLs are
	// filled in by the artifact-server. Added in v1 as an optional field.
	Outputs []GeneratedOutput `json:"outputs,omitempty"`
}

// Failure describes why a job failed, in the terms the watcher writes into
// the object's conditions. It is the bus form of a *failure.Error (see
// package failure), which services return and handle.
type Failure struct {
	// Condition is the negative-polarity condition the failure sets, e.g.
	// "FetchFailed" or "StorageOperationFailed"; empty when the failure is
	// reported by another field (a failed Verification sets SourceVerified
	// to False instead).
	Condition string `json:"condition,omitempty"`
	// Reason is Flux's reason, e.g. "GitOperationFailed", "URLInvalid".
	Reason string `json:"reason"`
	// Message is safe to show: it never contains credentials.
	Message string `json:"message"`
	// Stalled is true when retrying cannot help until the spec or a Secret
	// changes (an invalid URL, a malformed Secret).
	Stalled bool `json:"stalled,omitempty"`
	// Transient is true when the failure may pass by itself (an HTTP 429,
	// 503 or other 5xx, a timeout, a refused or reset connection, a
	// temporary DNS failure): once the bus has given up on the job
	// (Retrying is false), the watcher tries the source again on an
	// exponential backoff, as Flux requeues a failed reconcile.
	Transient bool `json:"transient,omitempty"`
	// Retrying is true when the bus delivers the job again after a
	// backoff: this outcome is not the job's last, and the watcher does
	// not make a new job for it.
	Retrying bool `json:"retrying,omitempty"`
	// RetryAfterMilliseconds, when positive, says the upstream host asked
	// to be left alone (a 429 or 503 with Retry-After) or the fetcher's
	// limit for it is spent: no request was sent, and the watcher makes
	// the source's next job after this many milliseconds, not on a
	// backoff (condition reason RateLimited, Reconciling True).
	RetryAfterMilliseconds int64 `json:"retryAfterMs,omitempty"`
}

// Notice is something worth a Kubernetes Event that is not the job's outcome.
type Notice struct {
	// Warning selects a Warning Event instead of a Normal one.
	Warning bool `json:"warning,omitempty"`
	// Reason and Message of the Event, e.g. "ArtifactVerificationFailed".
	Reason  string `json:"reason"`
	Message string `json:"message"`
}

// Reasons of the Notices a fetcher gives about the stored artifact a job
// names as Previous (Flux's Event reasons): the artifact is rebuilt, and
// the watcher shows the notice as a Warning Event.
const (
	// ArtifactMissingReason: the stored artifact is gone.
	ArtifactMissingReason = "ArtifactMissing"
	// ArtifactVerificationFailedReason: the stored artifact does not
	// match its digest, or cannot be read.
	ArtifactVerificationFailedReason = "ArtifactVerificationFailed"
)

// HookReceived is the data of TypeHookReceived: a webhook receiver
// accepted a valid request for a Receiver. The watcher reads the Receiver
// again before it acts, so the resources listed here say what the receiver
// saw (for subscribers and logs); they grant nothing.
type HookReceived struct {
	// Job names the Receiver (Object.Kind "Receiver") and the delivery:
	// its ID is derived from the provider's delivery ID when it sends one
	// (X-GitHub-Delivery, X-Request-UUID, ...), so a provider's redelivery
	// within the duplicate window is stored once. It is not sealed: only
	// the receiver identity may publish hooks.
	Job Job `json:"job"`
	// Type is the Receiver's spec.type, e.g. "github".
	Type string `json:"type"`
	// Event is the provider's event type (X-GitHub-Event, X-Gitlab-Event,
	// X-Event-Key), empty for the generic types.
	Event string `json:"event,omitempty"`
	// Resources are the Receiver's spec.resources, each namespace resolved
	// (the Receiver's own when unset).
	Resources []HookResource `json:"resources"`
}

// HookResource is one entry of a Receiver's spec.resources: one object,
// or with Name "*" every object of Kind in Namespace matching MatchLabels.
type HookResource struct {
	// APIVersion is the object's API version, empty for the default of
	// its kind.
	APIVersion string `json:"apiVersion,omitempty"`
	// Kind is the object's kind, e.g. "GitRepository".
	Kind string `json:"kind"`
	// Name is the object's name, or "*" for every object matching
	// MatchLabels.
	Name string `json:"name"`
	// Namespace is the object's namespace.
	Namespace string `json:"namespace"`
	// MatchLabels selects the objects when Name is "*".
	MatchLabels map[string]string `json:"matchLabels,omitempty"`
}

// ReceiverKind is the Object.Kind of a HookReceived job.
const ReceiverKind = "Receiver"

// SubscriptionRef names a Subscription (events.headwater.dev) and pins the
// object and spec a report is about.
type SubscriptionRef struct {
	// Namespace and Name identify the Subscription.
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	// UID is its metadata.uid: a report for a deleted and re-created
	// Subscription of the same name is ignored.
	UID string `json:"uid"`
	// Generation is the metadata.generation the dispatcher delivered for.
	Generation int64 `json:"generation"`
}

// DeliveryReport is the data of TypeDeliveryReported: what one dispatcher
// replica did for one Subscription since its previous report. Counts are
// increments, so the reports of several replicas add up.
type DeliveryReport struct {
	Subscription SubscriptionRef `json:"subscription"`
	// Dispatcher names the replica that reports (its host name).
	Dispatcher string `json:"dispatcher"`
	// Delivered counts events the sink accepted (an HTTP 2xx, or stored
	// on the Subscription's NATS subject).
	Delivered int64 `json:"delivered,omitempty"`
	// Failed counts failed attempts, the retried ones included.
	Failed int64 `json:"failed,omitempty"`
	// DeadLettered counts events given up after the last attempt.
	DeadLettered int64 `json:"deadLettered,omitempty"`
	// LastDelivered is when the last accepted event was delivered.
	LastDelivered *time.Time `json:"lastDelivered,omitempty"`
	// LastDeadLetter is the last event given up, if any since the
	// previous report.
	LastDeadLetter *DeadLetter `json:"lastDeadLetter,omitempty"`
	// Problem, when set, is what keeps the dispatcher from delivering at
	// all (an invalid selector, a missing Secret, a NATS consumer name
	// taken by another Subscription); nil means it delivers.
	Problem *Failure `json:"problem,omitempty"`
}

// DeadLetter records an event a Subscription's sink never accepted.
type DeadLetter struct {
	// EventID, EventType and Subject are the event's CloudEvent id, type
	// and subject; the event itself stays on HEADWATER_EVENTS for a day.
	EventID   string `json:"eventID"`
	EventType string `json:"eventType"`
	Subject   string `json:"subject"`
	// Time is when the last attempt failed.
	Time time.Time `json:"time"`
	// Attempts is how many deliveries were tried.
	Attempts int64 `json:"attempts"`
	// Error is why the last attempt failed (the HTTP status, a timeout);
	// it never contains credentials.
	Error string `json:"error"`
}

// ArtifactAddress is the data of TypeArtifactAddress.
type ArtifactAddress struct {
	// BaseURL is what every artifact URL the artifact-server announces
	// starts with: http://<advertised address>/; an artifact's URL is
	// BaseURL followed by its path.
	BaseURL string `json:"baseURL"`
}

// ArtifactGeneratorKind is the Object.Kind of the jobs of an
// ArtifactGenerator (source.extensions.fluxcd.io/v1beta1): they go to the
// packagers on PackageSubject(ArtifactGeneratorKind).
const ArtifactGeneratorKind = swv1beta1.ArtifactGeneratorKind

// GeneratedKind is the storage kind of the artifacts an ArtifactGenerator
// produces: each output is stored under
// externalartifact/<namespace>/<output name>/, as the ExternalArtifact it
// is published as.
const GeneratedKind = "ExternalArtifact"

// GenerateRequested is the data of TypeGenerateRequested: compose the
// outputs of one ArtifactGenerator from the artifacts of its sources. The
// watcher resolved every source to the artifact it has now and checked the
// spec (aliases, names, paths); the packager checks the paths again.
type GenerateRequested struct {
	// Job names the ArtifactGenerator.
	Job Job `json:"job"`
	// Revision identifies what the job was made from: the digest of the
	// generator's sources as the watcher resolved them (its
	// status.observedSourcesDigest once the outcome is applied). The
	// outcome carries it as its revision, so the watcher applies only the
	// outcome of the sources it sees now.
	Revision string `json:"revision"`
	// Sources are the generator's spec.sources, each with its artifact.
	Sources []GeneratorSource `json:"sources"`
	// Artifacts are the generator's spec.artifacts: the outputs to
	// compose, in order.
	Artifacts []swv1beta1.OutputArtifact `json:"artifacts"`
	// PathPattern is the generator's spec.pathPattern: when set,
	// Artifacts are templates, expanded by the packager once per
	// directory of the source's tree the pattern matches. Added in v1 as
	// an optional field.
	PathPattern string `json:"pathPattern,omitempty"`
	// Foreign are the names of the ExternalArtifacts of the generator's
	// namespace that another producer owns: an output the pattern names so
	// is refused before anything is stored. Added in v1 as an optional
	// field.
	Foreign []string `json:"foreign,omitempty"`
	// Previous are the outputs stored before (the generator's
	// inventory): an output whose content is unchanged keeps its
	// artifact, and the stored files of a previous output no longer in
	// Artifacts are removed.
	Previous []GeneratedOutput `json:"previous,omitempty"`
}

// GeneratorSource is one of an ArtifactGenerator's sources, resolved.
type GeneratorSource struct {
	// Alias is the source's alias in copy operations ("@alias/...").
	Alias string `json:"alias"`
	// Kind, Namespace and Name identify the source object.
	Kind      string `json:"kind"`
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	// Artifact is the source's artifact, read from storage by its Path.
	Artifact meta.Artifact `json:"artifact"`
}

// GeneratedOutput is one output of an ArtifactGenerator: the artifact
// stored for it.
type GeneratedOutput struct {
	// Name is the output's name, and its ExternalArtifact's.
	Name string `json:"name"`
	// Artifact is the stored artifact (URL filled in by the
	// artifact-server). Its revision is "latest@sha256:<content hash>",
	// or the revision of the source the output's spec.revision names.
	Artifact meta.Artifact `json:"artifact"`
	// Changed is true when the output's content is new since the
	// job's Previous outputs: only then is a new artifact published.
	Changed bool `json:"changed,omitempty"`
	// Labels are the captures of the generator's pathPattern that made
	// the output (lowercased), set on its ExternalArtifact. Added in v1 as
	// an optional field.
	Labels map[string]string `json:"labels,omitempty"`
}
