// Package fetchjob is the protocol every fetcher follows with a fetch job,
// the built-in fetcher's (services/fetcher) and the plug-in kinds'
// (pkg/sourcekit) alike: take the job off its message (Requested), check
// the stored artifact it names as Previous (CheckPrevious), answer a
// revision that artifact already holds (Unchanged), stage new content in
// the shared storage (WorkDir, StageTree, StageFile) and hand it to the
// packager (Hand), and publish a failure as the job's outcome (Report).
// What a fetcher does between those steps (resolve, download, share
// identical content) is its own.
package fetchjob

import (
	"context"
	"fmt"

	"github.com/go-logr/logr"

	"github.com/headwater-gitops/headwater/pkg/events"
	"github.com/headwater-gitops/headwater/pkg/failure"
)

// Publisher publishes CloudEvents; *bus.Publisher is one.
type Publisher interface {
	Publish(ctx context.Context, subject, eventType string, job events.Job, data any) error
}

// Requested returns the fetch job msg carries; any other event on the
// fetch stream is malformed (events.ErrMalformed).
func Requested(msg *events.Message) (*events.FetchRequested, error) {
	req, ok := msg.Data.(*events.FetchRequested)
	if !ok {
		return nil, fmt.Errorf("%w: unexpected event type %s on the fetch stream", events.ErrMalformed, msg.Event.Type())
	}
	return req, nil
}

// Unchanged answers a job whose upstream revision is the one its intact
// Previous artifact holds. A quiet job (a steady source's, whose outcome
// would change nothing in status) is answered with nothing, and Unchanged
// returns false; any other with FetchUnchanged, naming the artifact, on
// the kind's publish subject.
func Unchanged(ctx context.Context, pub Publisher, req *events.FetchRequested) (published bool, err error) {
	log := logr.FromContextOrDiscard(ctx)
	prev := req.Previous
	if req.Quiet {
		log.V(1).Info("revision unchanged; steady source, nothing published", "revision", prev.Revision)
		return false, nil
	}
	out := &events.Outcome{Job: req.Job, Revision: prev.Revision, Artifact: prev}
	if err := pub.Publish(ctx, events.PublishSubject(req.Job.Object.Kind), events.TypeFetchUnchanged, req.Job, out); err != nil {
		return false, err
	}
	log.V(1).Info("revision unchanged", "revision", prev.Revision)
	return true, nil
}

// Hand hands out, content staged (or an artifact to reuse), to the
// packager of its job's kind.
func Hand(ctx context.Context, pub Publisher, out *events.Fetched) error {
	return pub.Publish(ctx, events.PackageSubject(out.Job.Object.Kind), events.TypeFetched, out.Job, out)
}

// Report publishes f, the failure of msg's fetch job, as the job's
// FetchFailed outcome, with the revision resolved before the failure and
// its notices; verification, when set, is the failed signature check that
// f is.
func Report(ctx context.Context, pub Publisher, msg *events.Message, f *failure.Error, verification *events.Verification) error {
	req, ok := msg.Data.(*events.FetchRequested)
	if !ok {
		return fmt.Errorf("report: %T is not a fetch request", msg.Data)
	}
	out := &events.Outcome{Job: req.Job, Revision: f.Revision, Failure: f.Data(), Notices: f.Notices, Verification: verification}
	// The kind's own subject: the only one a plug-in's identity may
	// publish on.
	return pub.Publish(ctx, events.PublishSubject(req.Job.Object.Kind), events.TypeFetchFailed, req.Job, out)
}
