package gitfetch

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/go-git/go-git/v5/plumbing"
	"github.com/go-git/go-git/v5/plumbing/format/packfile"
	"github.com/go-git/go-git/v5/plumbing/protocol/packp"
	"github.com/go-git/go-git/v5/plumbing/protocol/packp/capability"
	"github.com/go-git/go-git/v5/plumbing/protocol/packp/sideband"
	"github.com/go-git/go-git/v5/plumbing/transport"
	"github.com/go-git/go-git/v5/plumbing/transport/client"
	"github.com/go-git/go-git/v5/storage"
)

// advertised is what a remote's upload-pack advertised: its references
// (with the peeled commit of each annotated tag appended, named
// "<tag>^{}", as go-git's List returns them with AppendPeeled) and its
// capabilities.
type advertised struct {
	refs []*plumbing.Reference
	caps *capability.List
}

// session opens an upload-pack session with the remote, with the
// source's credentials, TLS settings and proxy, as go-git's own fetch and
// list do.
func (r *resolved) session(ctx context.Context) (transport.UploadPackSession, error) {
	ep, err := transport.NewEndpoint(r.url)
	if err != nil {
		return nil, err
	}
	ep.ClientCert, ep.ClientKey, ep.CaBundle, ep.Proxy = r.creds.cert, r.creds.key, r.creds.ca, r.creds.proxyFor(ctx)
	c, err := client.NewClient(ep)
	if err != nil {
		return nil, err
	}
	return c.NewUploadPackSession(ep, r.creds.method)
}

// advertise asks the remote for its references and capabilities.
func (r *resolved) advertise(ctx context.Context) (adv *advertised, err error) {
	s, err := r.session(ctx)
	if err != nil {
		return nil, err
	}
	defer func() {
		if cerr := s.Close(); err == nil && cerr != nil {
			err = cerr
		}
	}()
	ar, err := s.AdvertisedReferencesContext(ctx)
	if err != nil {
		return nil, err
	}
	all, err := ar.AllReferences()
	if err != nil {
		return nil, err
	}
	adv = &advertised{caps: ar.Capabilities}
	for _, ref := range all {
		adv.refs = append(adv.refs, ref)
	}
	for name, h := range ar.Peeled {
		adv.refs = append(adv.refs, plumbing.NewReferenceFromStrings(name+tagDereferenceSuffix, h.String()))
	}
	return adv, nil
}

// errNotListed: the listing has no tip for the reference to fetch.
var errNotListed = errors.New("reference not in the listing")

// fetchListed downloads, at depth 1, the tip of r.reference that the
// listing advertised, in one request, into st, and points targetRef at
// it. The listing told the hash and the server's capabilities, so the
// advertisement go-git's fetch asks for first (over HTTP a second listing,
// and a second git process on the server) is skipped. Over HTTP the
// protocol is stateless, so no session has to outlive the listing.
func (r *resolved) fetchListed(ctx context.Context, st storage.Storer) (err error) {
	if r.adv == nil {
		return errNotListed
	}
	name, _ := strings.CutSuffix(r.reference, tagDereferenceSuffix)
	tip, ok := r.refs.refs[name]
	if !ok {
		return errNotListed
	}
	want := plumbing.NewHash(tip)
	req := packp.NewUploadPackRequestFromCapabilities(r.adv.caps)
	req.Wants = []plumbing.Hash{want}
	req.Depth = packp.DepthCommits(1)
	if err := req.Capabilities.Set(capability.Shallow); err != nil {
		return err
	}
	if r.adv.caps.Supports(capability.NoProgress) {
		if err := req.Capabilities.Set(capability.NoProgress); err != nil {
			return err
		}
	}
	s, err := r.session(ctx)
	if err != nil {
		return err
	}
	defer func() {
		if cerr := s.Close(); err == nil && cerr != nil {
			err = cerr
		}
	}()
	resp, err := s.UploadPack(ctx, req)
	if err != nil {
		return err
	}
	defer func() {
		if cerr := resp.Close(); err == nil && cerr != nil {
			err = cerr
		}
	}()
	if len(resp.Shallows) > 0 {
		if err := st.SetShallow(resp.Shallows); err != nil {
			return err
		}
	}
	var pack io.Reader = resp
	switch {
	case req.Capabilities.Supports(capability.Sideband64k):
		pack = sideband.NewDemuxer(sideband.Sideband64k, resp)
	case req.Capabilities.Supports(capability.Sideband):
		pack = sideband.NewDemuxer(sideband.Sideband, resp)
	}
	if err := packfile.UpdateObjectStorage(st, pack); err != nil {
		return fmt.Errorf("receiving packfile: %w", err)
	}
	return st.SetReference(plumbing.NewHashReference(targetRef, want))
}
