// Package seal proves that a job was issued by the watcher: every job the
// watcher publishes carries an HMAC of what identifies it (events.Job.Seal),
// made with a key only the watcher holds, and the watcher applies an
// outcome only when its job's seal checks out. Every other service carries
// the job unchanged, so a service that may publish results (a packager, an
// artifact-server) cannot make up a job for a source and point its status
// at an artifact of its choosing.
//
// The key is derived from a secret every watcher replica holds and nothing
// else does (its bus identity's NKey seed, or a key file of its own), so it
// survives restarts and leader failover: any replica verifies the jobs any
// other issued.
package seal

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"hash"
	"os"
	"strconv"
	"time"

	"github.com/headwater-gitops/headwater/pkg/events"
)

// domain separates the seal key from any other use of the secret it is
// derived from (the NKey seed also signs the bus's authentication nonce).
const domain = "headwater job seal v1"

// minSecret is the shortest secret a key is derived from: 32 bytes, the
// strength of an NKey seed.
const minSecret = 32

// ErrUnsealed marks a job whose seal is missing or does not check out: the
// watcher did not issue it.
var ErrUnsealed = errors.New("job not issued by this watcher")

// Key seals and verifies jobs.
type Key struct {
	key []byte
}

// NewKey derives a key from secret, which must be at least 32 bytes.
func NewKey(secret []byte) (*Key, error) {
	if len(secret) < minSecret {
		return nil, fmt.Errorf("job seal secret: %d bytes, need at least %d", len(secret), minSecret)
	}
	m := hmac.New(sha256.New, secret)
	m.Write([]byte(domain))
	return &Key{key: m.Sum(nil)}, nil
}

// LoadKey derives a key from the first of files that is not empty (an
// NKey seed file, a NATS credentials file or a key file of the watcher's
// own).
func LoadKey(files ...string) (*Key, error) {
	for _, f := range files {
		if f == "" {
			continue
		}
		secret, err := os.ReadFile(f)
		if err != nil {
			return nil, fmt.Errorf("job seal key: %w", err)
		}
		k, err := NewKey(secret)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", f, err)
		}
		return k, nil
	}
	return nil, errors.New("job seal key: no secret to derive it from (set -job-key-file, -nats-nkey or -nats-creds)")
}

// Seal sets job.Seal: call it once the job's other fields are final.
func (k *Key) Seal(job *events.Job) {
	job.Seal = k.mac(*job)
}

// Verify returns nil when job carries the seal this key makes for it, and
// an error wrapping ErrUnsealed otherwise.
func (k *Key) Verify(job events.Job) error {
	if job.Seal == "" {
		return fmt.Errorf("%w: job %q has no seal", ErrUnsealed, job.ID)
	}
	if !hmac.Equal([]byte(job.Seal), []byte(k.mac(job))) {
		return fmt.Errorf("%w: job %q has a wrong seal", ErrUnsealed, job.ID)
	}
	return nil
}

// mac covers every field of the job the watcher acts on when its outcome
// arrives: which object it is for, down to the UID and generation, the
// reconcile request it handles, and when it was made. Each field is
// length-prefixed, so no two jobs encode alike.
func (k *Key) mac(job events.Job) string {
	m := hmac.New(sha256.New, k.key)
	for _, f := range []string{
		job.ID,
		job.Object.Kind, job.Object.Namespace, job.Object.Name, job.Object.UID,
		strconv.FormatInt(job.Object.Generation, 10),
		job.ReconcileToken,
		job.RequestedAt.UTC().Format(time.RFC3339Nano),
	} {
		writeField(m, f)
	}
	return base64.RawURLEncoding.EncodeToString(m.Sum(nil))
}

func writeField(h hash.Hash, s string) {
	var n [binary.MaxVarintLen64]byte
	h.Write(n[:binary.PutUvarint(n[:], uint64(len(s)))])
	h.Write([]byte(s))
}
