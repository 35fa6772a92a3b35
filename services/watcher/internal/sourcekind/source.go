// Package sourcekind adapts each Flux source kind (and each plug-in kind)
// to the watcher's generic reconciler and outcome handler: how to make an
// empty object, what its fetch request carries, and where its common
// status fields live. The contract is kind.go: a Kind is data (names,
// message formats, the conditions in the order that decides Ready) and an
// Adapter, which each kind's file builds with Adapt from functions
// written for its Go type. (The fetcher's package source is another
// thing: its fetch handlers.)
package sourcekind

import (
	"net/url"
	"strings"

	"github.com/fluxcd/pkg/apis/meta"
	sourcev1 "github.com/fluxcd/source-controller/api/v1"

	"github.com/headwater-gitops/headwater/pkg/failure"
)

// NegativePolarity reports whether a condition type is abnormal-true: True
// means something is wrong (FetchFailed, StorageOperationFailed,
// IncludeUnavailable, BuildFailed, ArtifactOutdated, Reconciling, Stalled). Every other
// condition a source has (Ready, ArtifactInStorage, SourceVerified) is
// normal-polarity: True means all is well.
func NegativePolarity(conditionType string) bool {
	switch conditionType {
	case sourcev1.FetchFailedCondition, sourcev1.StorageOperationFailedCondition, sourcev1.IncludeUnavailableCondition,
		sourcev1.BuildFailedCondition, sourcev1.ArtifactOutdatedCondition, meta.ReconcilingCondition, meta.StalledCondition:
		return true
	}
	return false
}

// Kinds lists every kind the watcher reconciles.
func Kinds() []Kind {
	return []Kind{GitRepository(), Bucket(), OCIRepository(), HelmRepository(), HelmChart()}
}

// ByName returns the built-in kind with the given name.
func ByName(name string) (Kind, bool) {
	return Set(Kinds()).ByName(name)
}

// Set is the kinds one watcher reconciles: the built-in ones and the
// plug-in kinds it is configured with.
type Set []Kind

// NewSet returns the built-in kinds and a kind for each of regs.
func NewSet(regs []Registration) Set {
	s := Set(Kinds())
	for _, r := range regs {
		s = append(s, Plugin(r))
	}
	return s
}

// ByName returns the kind with the given name; a nil Set holds the
// built-in kinds.
func (s Set) ByName(name string) (Kind, bool) {
	if s == nil {
		s = Kinds()
	}
	for _, k := range s {
		if k.Name == name {
			return k, true
		}
	}
	return Kind{}, false
}

// waiting is the failure of a job that cannot be made until something else
// changes (an included source gets an artifact): the condition
// (abnormal-true), Ready=False with reason and message, a Warning Event, and
// a look again later; with stalled, only after the spec changes.
func waiting(condition, reason string, stalled bool, format string, args ...any) *failure.Error {
	h := failure.Waiting
	if stalled {
		h = failure.Stalling
	}
	return failure.New(h, condition, reason, format, args...)
}

// refuseCredentials refuses a URL that carries credentials in its user-info
// (https://user:token@host/..., https://token@host/..., oci://user:token@...):
// a job's spec travels on the bus, where no credential may go. An SSH user
// name alone (ssh://git@host/...) is no credential. A URL that does not
// parse is refused too when it has an '@' (a password with a character a
// URL must escape makes the whole URL invalid: it may still hold the
// credentials). The source stalls with a message saying where the
// credentials belong; the URL itself is not repeated.
func refuseCredentials(field, raw string) error {
	if !strings.Contains(raw, "://") {
		// A Bucket endpoint is host[:port]: read it as an authority.
		raw = "//" + raw
	}
	u, err := url.Parse(raw)
	if err != nil {
		if !strings.Contains(raw, "@") {
			// An unparsable URL is the fetcher's to report.
			return nil
		}
		return failure.New(failure.Stalling, sourcev1.FetchFailedCondition, sourcev1.URLInvalidReason,
			"%s is not a valid URL and may carry credentials, which Headwater never sends over its bus: "+
				"correct it, and put any credentials in a Secret named by spec.secretRef", field)
	}
	if u.User == nil {
		return nil
	}
	if _, password := u.User.Password(); !password && u.Scheme == "ssh" {
		return nil
	}
	return failure.New(failure.Stalling, sourcev1.FetchFailedCondition, sourcev1.URLInvalidReason,
		"%s carries credentials in its user-info, which Headwater never sends over its bus: "+
			"remove them and put them in a Secret named by spec.secretRef", field)
}

// RemoteKey is a Kind's Remote for an object whose upstream is location,
// reached with auth (Secret names, a provider, a service account): the
// same location with the same credentials is one remote. Credentials are
// namespaced, so the object's namespace is part of the key when any of
// auth is set; a public location is one remote across namespaces.
func RemoteKey(obj Object, location string, auth ...string) string {
	key := location
	for _, a := range auth {
		if a != "" {
			return obj.GetNamespace() + "\x00" + location + "\x00" + strings.Join(auth, "\x00")
		}
	}
	return key
}

// localRef is the name a reference holds, empty for none.
func localRef(r *meta.LocalObjectReference) string {
	if r == nil {
		return ""
	}
	return r.Name
}
