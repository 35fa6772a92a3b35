package gitfetch

import (
	"context"
	"errors"
	"fmt"
	"net/url"

	sourcev1 "github.com/fluxcd/source-controller/api/v1"
	"github.com/go-git/go-git/v5/plumbing/transport"
	githttp "github.com/go-git/go-git/v5/plumbing/transport/http"

	"github.com/headwater-gitops/headwater/pkg/events"
	"github.com/headwater-gitops/headwater/services/fetcher/internal/source"
)

// Secret keys Flux reads for HTTP(S) Git authentication.
const (
	keyUsername    = "username"
	keyPassword    = "password"
	keyBearerToken = "bearerToken"
	keyCA          = "ca.crt"
	keyCAFile      = "caFile" // deprecated spelling, still read by Flux
)

// credentials are what a fetch authenticates with.
type credentials struct {
	method transport.AuthMethod
	ca     []byte
}

// authenticate reads the Secret req names, if any, and builds the
// credentials for u with Flux's rules: ca.crt (or caFile) for the TLS
// roots; bearerToken when present, else username and password; the URL's
// user-info when the Secret has none.
func (s *Source) authenticate(ctx context.Context, req *events.FetchRequested, u *url.URL) (*credentials, error) {
	spec := req.GitRepository
	var data map[string][]byte
	if spec.SecretRef != nil {
		ns, name := req.Job.Object.Namespace, spec.SecretRef.Name
		if s.Secrets == nil {
			return nil, source.Failed(sourcev1.AuthenticationFailedReason,
				"failed to get secret '%s/%s': no Kubernetes API server is configured", ns, name)
		}
		d, err := s.Secrets.Get(ctx, ns, name)
		if err != nil {
			return nil, source.Failed(sourcev1.AuthenticationFailedReason, "failed to get secret '%s/%s': %w", ns, name, err)
		}
		if !hasAnyKey(d, keyUsername, keyPassword, keyBearerToken, keyCA, keyCAFile) {
			return nil, source.StalledError(sourcev1.AuthenticationFailedReason,
				"failed to configure authentication options: secret '%s/%s' has none of the keys '%s', '%s', '%s' or '%s'",
				ns, name, keyUsername, keyPassword, keyBearerToken, keyCA)
		}
		data = d
	}
	c, err := credentialsFor(u, data)
	if err != nil {
		return nil, &source.Error{Reason: sourcev1.AuthenticationFailedReason, Handling: source.Stalled,
			Err: fmt.Errorf("failed to configure authentication options: %w", err)}
	}
	return c, nil
}

// credentialsFor applies Flux's rules (git.NewAuthOptions and the go-git
// client's checks) to a Secret's data, which is nil without a Secret.
func credentialsFor(u *url.URL, data map[string][]byte) (*credentials, error) {
	c := &credentials{}
	var username, password, token string
	if data != nil {
		if c.ca = data[keyCA]; len(c.ca) == 0 {
			c.ca = data[keyCAFile]
		}
		if t, found := data[keyBearerToken]; found {
			token = string(t)
		} else {
			username, password = string(data[keyUsername]), string(data[keyPassword])
		}
	}
	if username == "" {
		username = u.User.Username()
	}
	if password == "" {
		password, _ = u.User.Password()
	}
	switch {
	case username == "" && password != "":
		return nil, fmt.Errorf("invalid '%s' auth option: 'password' requires 'username' to be set", u.Scheme)
	case token != "" && (username != "" || password != ""):
		return nil, errors.New("basic auth and bearer token cannot be set at the same time")
	case token != "":
		c.method = &githttp.TokenAuth{Token: token}
	case username != "":
		c.method = &githttp.BasicAuth{Username: username, Password: password}
	}
	return c, nil
}

func hasAnyKey(data map[string][]byte, keys ...string) bool {
	for _, k := range keys {
		if _, ok := data[k]; ok {
			return true
		}
	}
	return false
}
