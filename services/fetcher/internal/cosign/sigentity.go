package cosign

import (
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/sigstore/sigstore-go/pkg/bundle"
	"github.com/sigstore/sigstore-go/pkg/tlog"
	"github.com/sigstore/sigstore-go/pkg/verify"
	"github.com/sigstore/sigstore/pkg/cryptoutils"
)

// The annotations of a keyless signature layer of a ".sig" image (cosign
// v2's format): the Fulcio certificate, and the transparency log's
// promise of inclusion (a "Rekor bundle") and an RFC 3161 timestamp.
const (
	certificateAnnotation = "dev.sigstore.cosign/certificate"
	rekorBundleAnnotation = "dev.sigstore.cosign/bundle"
	timestampAnnotation   = "dev.sigstore.cosign/rfc3161timestamp"
)

// rekorBundle is a signature's transparency log entry, as cosign stores it
// in the rekorBundleAnnotation.
type rekorBundle struct {
	SignedEntryTimestamp []byte
	Payload              struct {
		Body           string `json:"body"`
		IntegratedTime int64  `json:"integratedTime"`
		LogIndex       int64  `json:"logIndex"`
		LogID          string `json:"logID"`
	}
}

// sigEntity is a keyless ".sig" layer read as the signed entity
// sigstore-go verifies: a message signature of the payload by the
// certificate's key, with its log entry (inclusion promise only, as a
// v0.1 bundle) and timestamps.
type sigEntity struct {
	verify.BaseSignedEntity
	cert       *x509.Certificate
	signature  []byte
	digest     []byte
	entry      *tlog.Entry
	timestamps [][]byte
}

// newSigEntity reads a keyless signature layer's annotations; payload is
// what it signs.
func newSigEntity(annotations map[string]string, payload []byte, sig []byte) (*sigEntity, error) {
	certs, err := cryptoutils.UnmarshalCertificatesFromPEM([]byte(annotations[certificateAnnotation]))
	if err != nil || len(certs) == 0 {
		return nil, errors.New("signature has no valid certificate")
	}
	raw := annotations[rekorBundleAnnotation]
	if raw == "" {
		return nil, errors.New("signature has no transparency log entry (cosign's bundle annotation): offline verification needs one")
	}
	var rb rekorBundle
	if err := json.Unmarshal([]byte(raw), &rb); err != nil {
		return nil, fmt.Errorf("invalid transparency log entry: %w", err)
	}
	body, err := base64.StdEncoding.DecodeString(rb.Payload.Body)
	if err != nil {
		return nil, fmt.Errorf("invalid transparency log entry: %w", err)
	}
	logID, err := hex.DecodeString(rb.Payload.LogID)
	if err != nil {
		return nil, fmt.Errorf("invalid transparency log entry: %w", err)
	}
	entry, err := tlog.NewEntry(body, rb.Payload.IntegratedTime, rb.Payload.LogIndex, logID, rb.SignedEntryTimestamp, nil) //nolint:staticcheck // the v1 entry cosign v2 stores
	if err != nil {
		return nil, fmt.Errorf("invalid transparency log entry: %w", err)
	}
	e := &sigEntity{cert: certs[0], signature: sig, entry: entry}
	sum := sha256.Sum256(payload)
	e.digest = sum[:]
	if ts := annotations[timestampAnnotation]; ts != "" {
		var t struct{ SignedRFC3161Timestamp []byte }
		if err := json.Unmarshal([]byte(ts), &t); err != nil {
			return nil, fmt.Errorf("invalid RFC 3161 timestamp: %w", err)
		}
		e.timestamps = [][]byte{t.SignedRFC3161Timestamp}
	}
	return e, nil
}

// HasInclusionPromise reports whether the log entry carries its signed
// entry timestamp.
func (e *sigEntity) HasInclusionPromise() bool { return e.entry.HasInclusionPromise() }

// VerificationContent is the signing certificate.
func (e *sigEntity) VerificationContent() (verify.VerificationContent, error) {
	return bundle.NewCertificate(e.cert), nil
}

// SignatureContent is the signature of the payload's SHA-256 digest.
func (e *sigEntity) SignatureContent() (verify.SignatureContent, error) {
	return bundle.NewMessageSignature(e.digest, "SHA2_256", e.signature), nil
}

// Timestamps are the RFC 3161 timestamps of the signature.
func (e *sigEntity) Timestamps() ([][]byte, error) { return e.timestamps, nil }

// TlogEntries is the signature's log entry.
func (e *sigEntity) TlogEntries() ([]*tlog.Entry, error) { return []*tlog.Entry{e.entry}, nil }

// Version is the bundle version whose rules the entity follows.
func (e *sigEntity) Version() (string, error) { return "v0.1", nil }
