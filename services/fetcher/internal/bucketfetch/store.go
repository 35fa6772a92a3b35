package bucketfetch

import (
	"context"
	"errors"
	"io"
	"strings"
)

// store is one provider's client for one bucket: the three calls resolving
// and downloading make. S3 (minio-go), Google Cloud Storage (its JSON API)
// and Azure Blob Storage (azblob) each implement it; everything else (the
// ignore rules, the revision, safe paths, size limits, concurrency and
// Flux's messages) is shared by resolved, so the providers differ only in
// listing and fetching.
//
// A store's errors carry no credentials: the clients' messages name the
// request's URL at most (a bearer token travels in a header), and
// failure.Error strips its query (a SAS token) and user-info before it is
// shown.
type store interface {
	// exists tells whether the bucket exists; an error means it could not
	// be told.
	exists(ctx context.Context) (bool, error)
	// list calls visit for every object whose key starts with prefix, in
	// any order, including directory markers and the ignore rules object
	// (resolved skips them); it stops at visit's first error.
	list(ctx context.Context, prefix string, visit func(key string, o object) error) error
	// get opens an object for reading, with its ETag (in the form list
	// gives it) and size as the server describes it now. The error wraps
	// errNoSuchObject when the object does not exist.
	get(ctx context.Context, key string) (io.ReadCloser, object, error)
}

// errNoSuchObject is wrapped by a store's get when the object does not
// exist.
var errNoSuchObject = errors.New("object does not exist")

// errDenied is wrapped by a store's errors when the server refused the
// credentials (401, 403) or the identity provider refused to issue a token:
// trying again with the same Secret fails the same way.
var errDenied = errors.New("access denied")

// classified wraps err with errDenied when denied; otherwise it returns err.
func classified(err error, denied bool) error {
	if err == nil || !denied {
		return err
	}
	return &deniedError{err: err}
}

// deniedError is an error the server answered with a refusal of the
// credentials.
type deniedError struct{ err error }

func (e *deniedError) Error() string   { return e.err.Error() }
func (e *deniedError) Unwrap() []error { return []error{e.err, errDenied} }

// validName tells whether name has min to max characters, lowercase ASCII
// letters, digits or one of punct, and starts and ends with a letter or
// digit: the shape of bucket and container names.
func validName(name string, min, max int, punct string) bool {
	if len(name) < min || len(name) > max {
		return false
	}
	alnum := func(c byte) bool { return c >= 'a' && c <= 'z' || c >= '0' && c <= '9' }
	for i := range len(name) {
		if c := name[i]; !alnum(c) && (i == 0 || i == len(name)-1 || !strings.ContainsRune(punct, rune(c))) {
			return false
		}
	}
	return true
}
