package providertoken

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/aws/smithy-go/aws-http-auth/credentials"
	"github.com/aws/smithy-go/aws-http-auth/sigv4"
	v4 "github.com/aws/smithy-go/aws-http-auth/v4"
)

const (
	// codeCommitTimeFormat is the time format of CodeCommit's signatures
	// (SigV4's without the trailing Z).
	codeCommitTimeFormat = "20060102T150405"
	// codeCommitValidity is how long CodeCommit accepts a signature.
	codeCommitValidity = 15 * time.Minute
)

// CodeCommitLogin returns the Git credentials of an AWS CodeCommit
// repository (repo, an https URL whose host names the region) for the
// role: its temporary credentials from STS, then, as git-remote-codecommit
// and Flux do, the user name "<access key ID>%<session token>" and a
// password made of the signing time and a SigV4 signature (service
// codecommit, method GIT, only the host signed). The login is cached, with
// scope (a namespace) in its key, for 80% of its 15 minutes.
func (w *AWSWebIdentity) CodeCommitLogin(ctx context.Context, client *http.Client, cache *Cache, scope, region string, repo *url.URL) (Login, error) {
	key := Key(ProviderAWS, "codecommit", scope, w.RoleARN, w.TokenFile, w.SessionName, w.STSEndpoint, region, repo.String())
	t, err := cache.Get(ctx, ProviderAWS, key, func(ctx context.Context) (Token, error) {
		creds, err := w.assumeRole(ctx, client, region)
		if err != nil {
			return Token{}, err
		}
		return signCodeCommit(creds, region, repo, time.Now().UTC())
	})
	if err != nil {
		return Login{}, err
	}
	return loginOf(t), nil
}

// signCodeCommit signs the repository URL at now with creds; the token's
// value is "user:password".
func signCodeCommit(creds AWSCredentials, region string, repo *url.URL, now time.Time) (Token, error) {
	req, err := http.NewRequest("GIT", repo.String(), nil)
	if err != nil {
		return Token{}, fmt.Errorf("failed to build CodeCommit signing request: %w", err)
	}
	req.Host = repo.Host
	signer := sigv4.New(func(o *v4.SignerOptions) {
		o.HeaderRules = hostOnly{}
		o.DisableUnsignedPayloadSentinel = true
		o.CanonicalTimeFormat = codeCommitTimeFormat
	})
	if err := signer.SignRequest(&sigv4.SignRequestInput{Request: req, Service: "codecommit", Region: region, Time: now,
		Credentials: credentials.Credentials{AccessKeyID: creds.AccessKeyID, SecretAccessKey: creds.SecretAccessKey,
			SessionToken: creds.SessionToken, Expires: creds.ExpiresAt}}); err != nil {
		return Token{}, fmt.Errorf("failed to sign request: %w", err)
	}
	_, signature, _ := strings.Cut(req.Header.Get("Authorization"), "Signature=")
	user := creds.AccessKeyID + "%" + creds.SessionToken
	password := now.Format(codeCommitTimeFormat) + "Z" + signature
	return Token{Value: user + ":" + password, ExpiresAt: minTime(now.Add(codeCommitValidity), creds.ExpiresAt)}, nil
}

// hostOnly signs the host header only.
type hostOnly struct{}

// IsSigned reports whether header h is signed.
func (hostOnly) IsSigned(h string) bool { return h == "host" }

func minTime(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}
