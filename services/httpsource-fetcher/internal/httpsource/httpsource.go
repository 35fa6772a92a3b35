// Package httpsource fetches HTTPSources: one conditional GET per check
// (If-None-Match, If-Modified-Since), a tarball extracted safely or a
// single file kept as it is, the revision the SHA-256 of what was served.
package httpsource

import (
	"context"
	"encoding/json"
	"errors"
	"mime"
	"net/http"
	"net/url"
	"os"
	"path"
	"path/filepath"
	"strings"

	"github.com/fluxcd/pkg/apis/acl"
	sourcev1 "github.com/fluxcd/source-controller/api/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/headwater-gitops/headwater/pkg/egress"
	"github.com/headwater-gitops/headwater/pkg/sourcekit"
	"github.com/headwater-gitops/headwater/services/httpsource-fetcher/api/v1alpha1"
)

// ContentTypeReason is the reason of a URL that serves an HTML page.
const ContentTypeReason = "UnexpectedContentType"

// Metadata keys of the artifact that the next check's conditional request
// is made from.
const (
	ETagKey         = "etag"
	LastModifiedKey = "last-modified"
)

// Fetcher fetches HTTPSources.
type Fetcher struct {
	// Client makes the requests; http.DefaultClient when nil.
	Client *http.Client
	// MaxSize bounds the bytes downloaded, and extracted from a tarball.
	MaxSize int64
}

// Fetch is the kind's sourcekit.FetchFunc.
func (f *Fetcher) Fetch(ctx context.Context, req *sourcekit.Request) (*sourcekit.Result, error) {
	var spec v1alpha1.HTTPSourceSpec
	if err := json.Unmarshal(req.Spec, &spec); err != nil {
		return nil, sourcekit.Stalled(sourcev1.URLInvalidReason, "invalid spec: %s", err.Error())
	}
	u, err := url.Parse(spec.URL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.User != nil {
		return nil, sourcekit.Stalled(sourcev1.URLInvalidReason,
			"spec.url must be an http(s) URL without credentials (put them in the Secret of spec.secretRef)")
	}
	if spec.Timeout != nil && spec.Timeout.Duration > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, spec.Timeout.Duration)
		defer cancel()
	}
	r, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return nil, sourcekit.Stalled(sourcev1.URLInvalidReason, "invalid spec.url: %s", err.Error())
	}
	if err := f.authenticate(ctx, req, spec, r); err != nil {
		return nil, err
	}
	if prev := req.Previous; prev != nil {
		// One conditional request: a 304 costs no download.
		if v := prev.Metadata[ETagKey]; v != "" {
			r.Header.Set("If-None-Match", v)
		}
		if v := prev.Metadata[LastModifiedKey]; v != "" {
			r.Header.Set("If-Modified-Since", v)
		}
	}
	client := f.Client
	if client == nil {
		client = http.DefaultClient
	}
	shown := u.Scheme + "://" + u.Host + u.Path // no query: it may hold a token
	resp, err := client.Do(r)
	if egress.Refused(err) {
		// The same URL is refused at the next try: stalled until the
		// spec or the policy changes. Nothing of the destination is told.
		return nil, sourcekit.Stalled(acl.AccessDeniedReason, "failed to fetch %s: %s", shown, egress.ErrRefused)
	}
	if err != nil {
		return nil, sourcekit.Transient(sourcev1.URLInvalidReason, "failed to fetch %s: %s", shown, unwrapURLError(err))
	}
	defer resp.Body.Close()
	switch {
	case resp.StatusCode == http.StatusNotModified && req.Previous != nil:
		return &sourcekit.Result{Unchanged: true}, nil
	case resp.StatusCode == http.StatusUnauthorized || resp.StatusCode == http.StatusForbidden:
		return nil, sourcekit.Stalled(sourcev1.AuthenticationFailedReason, "failed to fetch %s: %s", shown, resp.Status)
	case resp.StatusCode >= 500 || resp.StatusCode == http.StatusTooManyRequests:
		return nil, sourcekit.Transient(sourcev1.URLInvalidReason, "failed to fetch %s: %s", shown, resp.Status)
	case resp.StatusCode != http.StatusOK:
		return nil, sourcekit.Final(sourcev1.URLInvalidReason, "failed to fetch %s: %s", shown, resp.Status)
	}
	ctype, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type"))
	if ctype == "text/html" {
		return nil, sourcekit.Final(ContentTypeReason, "%s served an HTML page (%s), not content: a wrong URL or a login page?", shown, ctype)
	}
	tarball := strings.HasSuffix(u.Path, ".tar.gz") || strings.HasSuffix(u.Path, ".tgz") ||
		ctype == "application/gzip" || ctype == "application/x-gzip" || ctype == "application/x-tar+gzip"

	// The body goes to a file first: its digest is the revision, and a
	// tarball is extracted only once it is whole.
	body := filepath.Join(req.Dir, "body")
	digest, err := sourcekit.Download(resp.Body, body, f.MaxSize)
	if err != nil {
		return nil, err
	}
	res := &sourcekit.Result{Revision: "sha256:" + digest, Dir: filepath.Join(req.Dir, "tree"),
		Metadata: map[string]string{ETagKey: resp.Header.Get("ETag"), LastModifiedKey: resp.Header.Get("Last-Modified")}}
	if tarball {
		return res, sourcekit.ExtractTarGz(body, res.Dir, f.MaxSize)
	}
	name := path.Base(u.Path)
	if name == "/" || name == "." {
		name = "index"
	}
	if err := os.MkdirAll(res.Dir, 0o755); err != nil {
		return nil, err
	}
	return res, os.Rename(body, filepath.Join(res.Dir, name))
}

// authenticate adds the credentials of spec.secretRef to r.
func (f *Fetcher) authenticate(ctx context.Context, req *sourcekit.Request, spec v1alpha1.HTTPSourceSpec, r *http.Request) error {
	if spec.SecretRef == nil {
		return nil
	}
	var s corev1.Secret
	if req.Secrets == nil {
		return sourcekit.Stalled(sourcev1.AuthenticationFailedReason, "cannot read secret '%s': no cluster", spec.SecretRef.Name)
	}
	if err := req.Secrets.Get(ctx, types.NamespacedName{Namespace: req.Namespace, Name: spec.SecretRef.Name}, &s); err != nil {
		return sourcekit.Stalled(sourcev1.AuthenticationFailedReason, "failed to get secret '%s': %s", spec.SecretRef.Name, err.Error())
	}
	switch {
	case len(s.Data["token"]) > 0:
		r.Header.Set("Authorization", "Bearer "+string(s.Data["token"]))
	case len(s.Data["username"]) > 0:
		r.SetBasicAuth(string(s.Data["username"]), string(s.Data["password"]))
	default:
		return sourcekit.Stalled(sourcev1.AuthenticationFailedReason, "secret '%s' has neither token nor username", spec.SecretRef.Name)
	}
	return nil
}

// unwrapURLError drops the *url.Error wrapper, which repeats the URL (and
// its query).
func unwrapURLError(err error) string {
	var ue *url.Error
	if errors.As(err, &ue) {
		return ue.Err.Error()
	}
	return err.Error()
}
