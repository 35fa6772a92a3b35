package cosign

import (
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/sigstore/sigstore-go/pkg/root"
	"github.com/sigstore/sigstore-go/pkg/tuf"
	"github.com/theupdateframework/go-tuf/v2/metadata/fetcher"
)

// PublicRoot is the public Sigstore trusted root (Fulcio, Rekor, the CT
// logs), read once per process from Sigstore's TUF repository (its root
// of trust is embedded in sigstore-go) and shared by every keyless
// verification without spec.verify.trustedRootSecretRef, as Flux's
// verifier factory does. After a failure it is tried again at most once
// per RetryInterval; until then the failure is returned.
type PublicRoot struct {
	// RetryInterval is how long a failure to read the root is remembered.
	RetryInterval time.Duration
	// Timeout bounds each request to the TUF repository.
	Timeout time.Duration
	// Mirror is the TUF repository's URL; Sigstore's when empty.
	Mirror string

	mu      sync.Mutex
	trusted root.TrustedMaterial
	err     error
	last    time.Time
}

// NewPublicRoot returns Sigstore's public trusted root, not yet read:
// retried once a minute after a failure, as Flux.
func NewPublicRoot() *PublicRoot {
	return &PublicRoot{RetryInterval: time.Minute, Timeout: 30 * time.Second}
}

// TrustedMaterial returns the public trusted root, reading it on first
// use, with Flux's message when it cannot be read.
func (p *PublicRoot) TrustedMaterial() (root.TrustedMaterial, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.trusted != nil {
		return p.trusted, nil
	}
	if p.err == nil || time.Since(p.last) >= p.RetryInterval {
		p.last = time.Now()
		var tr *root.TrustedRoot
		if tr, p.err = p.fetch(); p.err == nil {
			p.trusted = tr
		}
	}
	if p.err != nil {
		return nil, fmt.Errorf("unable to initialize trusted root from the public Sigstore TUF repository: %w", p.err)
	}
	return p.trusted, nil
}

// fetch reads the trusted root through TUF, cached in memory only (the
// fetcher's file system may be read-only).
func (p *PublicRoot) fetch() (*root.TrustedRoot, error) {
	opts := tuf.DefaultOptions().WithDisableLocalCache()
	if p.Mirror != "" {
		opts = opts.WithRepositoryBaseURL(p.Mirror)
	}
	f := fetcher.NewDefaultFetcher()
	f.SetHTTPClient(&http.Client{Transport: http.DefaultTransport.(*http.Transport).Clone(), Timeout: p.Timeout})
	f.SetHTTPUserAgent("headwater-fetcher")
	return root.FetchTrustedRootWithOptions(opts.WithFetcher(f))
}

// publicRoot is the process's public trusted root.
var publicRoot = NewPublicRoot()

// Public returns the process's public Sigstore trusted root, shared by
// every keyless verification without a trusted root of its own.
func Public() *PublicRoot { return publicRoot }

// StaticRoot is a PublicRoot that is trusted, already read: for tests,
// and for a fetcher that must not reach Sigstore's TUF repository.
func StaticRoot(trusted root.TrustedMaterial) *PublicRoot {
	return &PublicRoot{trusted: trusted}
}
