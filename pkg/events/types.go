package events

// CloudEvent types, one per message kind. The suffix is the version of the
// data struct; a breaking change to a struct adds a new version.
const (
	// TypeFetchRequested asks a fetcher to fetch a source. Data: FetchRequested.
	// Published by the watcher on FetchSubject(kind).
	TypeFetchRequested = "io.headwater.job.fetch.requested.v1"

	// TypeDeleteRequested asks a packager to remove every artifact of a
	// deleted source. Data: DeleteRequested. Published by the watcher on
	// PackageSubject(kind).
	TypeDeleteRequested = "io.headwater.job.delete.requested.v1"

	// TypeGenerateRequested asks a packager to compose the outputs of an
	// ArtifactGenerator from its sources' artifacts. Data:
	// GenerateRequested. Published by the watcher on
	// PackageSubject(ArtifactGeneratorKind); its outcome is a
	// TypePackaged (Outcome.Outputs) or TypePackageFailed.
	TypeGenerateRequested = "io.headwater.job.generate.requested.v1"

	// TypeFetched says a fetcher staged new content to package. Data: Fetched.
	// Published by the fetcher on PackageSubject(kind).
	TypeFetched = "io.headwater.job.fetch.succeeded.v1"

	// TypeFetchUnchanged says the upstream revision equals the stored
	// artifact's, which exists and is intact; nothing was downloaded.
	// Data: Outcome. Published by the fetcher on PublishSubject(kind).
	TypeFetchUnchanged = "io.headwater.job.fetch.unchanged.v1"

	// TypeFetchFailed says a fetch failed. Data: Outcome (with Failure).
	// Published by the fetcher on PublishSubject(kind).
	TypeFetchFailed = "io.headwater.job.fetch.failed.v1"

	// TypePackaged says a packager stored a new artifact. Data: Outcome (with
	// Artifact, URL empty). Published by the packager on PublishSubject(kind).
	TypePackaged = "io.headwater.job.package.succeeded.v1"

	// TypePackageFailed says a packager could not store an artifact.
	// Data: Outcome (with Failure). Published on PublishSubject(kind).
	TypePackageFailed = "io.headwater.job.package.failed.v1"

	// TypeDeleted says a packager removed a deleted source's artifacts.
	// Data: Outcome. Published on PublishSubject(kind).
	TypeDeleted = "io.headwater.job.delete.succeeded.v1"

	// TypeHookReceived says a webhook receiver accepted a valid push for a
	// Receiver (notification.toolkit.fluxcd.io/v1). Data: HookReceived.
	// Published by the receiver on HookSubject(namespace, name); the
	// watcher turns it into fetch jobs.
	TypeHookReceived = "io.headwater.hook.received.v1"
)

// Public CloudEvent types, published by the artifact-server on
// EventSubject(kind, namespace, name) for the watcher and any subscriber.
// Their data is always an Outcome.
const (
	// TypeArtifactStored announces a new artifact, with its download URL.
	TypeArtifactStored = "io.headwater.artifact.stored.v1"

	// TypeArtifactUnchanged announces that a reconcile found nothing new.
	TypeArtifactUnchanged = "io.headwater.artifact.unchanged.v1"

	// TypeArtifactFailed announces a failed fetch or package; the previous
	// artifact, if any, is still stored and served.
	TypeArtifactFailed = "io.headwater.artifact.failed.v1"

	// TypeArtifactDeleted announces that a deleted source's artifacts are gone.
	TypeArtifactDeleted = "io.headwater.artifact.deleted.v1"
)

// Subscription types (see docs/events.md, "Subscriptions"): the dispatcher
// tells the watcher how delivery to a Subscription goes, so that the
// watcher, which alone writes to the Kubernetes API, keeps its status.
const (
	// TypeDeliveryReported reports a dispatcher's deliveries for one
	// Subscription since its previous report: counts, the last delivery,
	// the last dead letter and any problem with the Subscription itself.
	// Data: DeliveryReport. Published by the dispatcher on
	// DeliverySubject(namespace, name).
	TypeDeliveryReported = "io.headwater.subscription.delivery.reported.v1"
)

// Control types: messages between services that carry no job and are not
// stored (core NATS, ControlSubjectPrefix).
const (
	// TypeArtifactAddress is an artifact-server's advertised address,
	// published on ArtifactAddressSubject when it starts, so that the
	// watchers learn at once that artifact URLs changed (see
	// FetchRequested.Quiet). Data: ArtifactAddress.
	TypeArtifactAddress = "io.headwater.control.artifact-address.v1"
)

// PublicType maps an internal result type to the public type the
// artifact-server announces it as; ok is false for types that are not results.
func PublicType(internal string) (public string, ok bool) {
	switch internal {
	case TypePackaged:
		return TypeArtifactStored, true
	case TypeFetchUnchanged:
		return TypeArtifactUnchanged, true
	case TypeFetchFailed, TypePackageFailed:
		return TypeArtifactFailed, true
	case TypeDeleted:
		return TypeArtifactDeleted, true
	}
	return "", false
}

// Source is the CloudEvent source attribute of every event a Headwater
// service publishes; the service name is appended as a path segment.
const Source = "headwater"
