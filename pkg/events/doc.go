// Package events is Headwater's bus contract: the CloudEvent types that travel
// on NATS JetStream, their typed data, the subjects they are published on and
// the streams and consumers that carry them.
//
// Every message on the bus is a CloudEvent (structured content mode, JSON)
// whose type is one of the versioned constants in this package and whose data
// is the struct documented beside that constant. A change that breaks a data
// struct gets a new type version; consumers reject types they do not know.
//
// The pipeline is:
//
//	watcher   --FetchRequested/DeleteRequested-->   headwater.jobs.fetch.<kind> / headwater.jobs.package.<kind>
//	fetcher   --Fetched-->                          headwater.jobs.package.<kind>
//	fetcher   --FetchUnchanged/FetchFailed-->       headwater.jobs.publish.<kind>
//	packager  --Packaged/PackageFailed/Deleted-->   headwater.jobs.publish.<kind>
//	artifact-server --ArtifactStored/...-->         headwater.events.<kind>.<namespace>.<name>
//	dispatcher --(the events of nats Subscriptions)-> headwater.subscriptions.<namespace>.<name>
//	dispatcher --DeliveryReported-->                headwater.delivery.<namespace>.<name>
//
// Credentials never travel on the bus: jobs carry the names of Secrets, and
// the fetcher reads them itself.
package events
