package storage

import (
	"bytes"
	"encoding/json"
	"fmt"
	"path"
	"time"
)

// A latest pointer follows job order: each pointer has an order record,
// a small object in the internal directory OrderDir (at the pointer's key
// + ".json", so a source's directory holds nothing new and nothing serves
// it), saying when the job that last set the pointer was requested and
// what it pointed at. SetLatest reads it first and leaves the pointer to
// a newer job's target as it is (ErrSuperseded); DeleteLatest does the
// same for a removal and leaves a record with no target behind, so that
// an older job does not set the pointer again; Delete of a pointer
// removes its record (a source deleted for good). Without
// it, a job finished late (its packager cut off from the bus, the job
// done again elsewhere and newer ones stored meanwhile) moved the pointer,
// and status.url with it, back to an older revision, and retention, which
// keeps the pointer's target, could then delete the artifact the source's
// status names.
//
// How the record and the pointer are updated together differs by backend
// (docs/design.md, "The latest pointer follows job order"):
//   - Dir holds an exclusive lock on the record file (flock, which a
//     shared volume's NFS client turns into a lock on the server) while it
//     reads and rewrites the record and renames the new symlink into
//     place; a process that dies drops its lock.
//   - S3 replaces the record with a conditional PUT (If-Match the ETag it
//     read, If-None-Match for a first record), copies the target to the
//     pointer, and reads the record again: a newer job's record there
//     means a newer copy may have landed first, so it copies that job's
//     target, until the record read is the one the last copy was made for.

// OrderDir is the internal directory of the latest pointers' order
// records.
const OrderDir = ".latest"

// orderKey is the key of the order record of the pointer key.
func orderKey(key string) string {
	return OrderDir + "/" + key + ".json"
}

// orderRecord is the content of an order record.
type orderRecord struct {
	// RequestedAt is when the job that last set the pointer was requested.
	RequestedAt time.Time `json:"requestedAt"`
	// Target is the file name (in the pointer's directory) it points at;
	// empty when that job removed the pointer (DeleteLatest).
	Target string `json:"target"`
}

// supersedes reports whether r was written for a job newer than one
// requested at requestedAt.
func (r orderRecord) supersedes(requestedAt time.Time) bool {
	return requestedAt.Before(r.RequestedAt)
}

// same reports whether r and o record the same job's move.
func (r orderRecord) same(o orderRecord) bool {
	return r.RequestedAt.Equal(o.RequestedAt) && r.Target == o.Target
}

// encode is the record's stored form.
func (r orderRecord) encode() []byte {
	b, _ := json.Marshal(r) // a time and a string always marshal
	return append(b, '\n')
}

// decodeOrder reads a stored record: its first JSON value, so that a Dir
// record a crash left between its rewrite and its truncation (the new
// record, then the old one's tail) reads as the new one. An empty record
// (a Dir record file just created) or one that cannot be read is the zero
// record, older than every job: the next SetLatest moves the pointer and
// writes it anew, rather than every one failing.
func decodeOrder(b []byte) orderRecord {
	var r orderRecord
	if err := json.NewDecoder(bytes.NewReader(b)).Decode(&r); err != nil {
		return orderRecord{}
	}
	return r
}

// checkPointer checks SetLatest's arguments: clean keys, target another
// object in the pointer's directory. It returns the clean pointer key.
func checkPointer(key, target string) (string, error) {
	key, err := CleanKey(key)
	if err != nil {
		return "", err
	}
	if _, err := CleanKey(target); err != nil {
		return "", fmt.Errorf("set latest %s: %w", key, err)
	}
	if path.Dir(key) != path.Dir(target) || key == target {
		return "", fmt.Errorf("set latest %s: %w: target %q is not another object in the same directory", key, ErrInvalidKey, target)
	}
	return key, nil
}

// superseded is SetLatest's error for a pointer a newer job set.
func superseded(key string, r orderRecord, requestedAt time.Time) error {
	return fmt.Errorf("set latest %s for a job requested at %s: %w (requested at %s, pointing at %s)",
		key, requestedAt.UTC().Format(time.RFC3339Nano), ErrSuperseded, r.RequestedAt.UTC().Format(time.RFC3339Nano), r.Target)
}
