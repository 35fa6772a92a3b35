package providertoken

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	"github.com/aws/aws-sdk-go-v2/service/ecr"
	"github.com/aws/aws-sdk-go-v2/service/sts"
)

// ProviderAWS names AWS credentials in metrics and logs.
const ProviderAWS = "aws"

// Environment of an IAM role for a service account (IRSA), as EKS's pod
// identity webhook sets it and the AWS SDK's default chain reads it, and
// the SDK's service-specific endpoint overrides (VPC endpoints, and the
// tests' STS and ECR).
const (
	EnvAWSRoleARN              = "AWS_ROLE_ARN"
	EnvAWSWebIdentityTokenFile = "AWS_WEB_IDENTITY_TOKEN_FILE"
	EnvAWSRoleSessionName      = "AWS_ROLE_SESSION_NAME"
	EnvAWSEndpointURL          = "AWS_ENDPOINT_URL"
	EnvAWSEndpointURLSTS       = "AWS_ENDPOINT_URL_STS"
	EnvAWSEndpointURLECR       = "AWS_ENDPOINT_URL_ECR"
)

// AWSCredentials are temporary AWS credentials (STS's).
type AWSCredentials struct {
	AccessKeyID, SecretAccessKey, SessionToken string
	ExpiresAt                                  time.Time
}

// AWSWebIdentity is the fetcher's own AWS identity: an IAM role that trusts
// the Kubernetes service account token in TokenFile, assumed with STS's
// AssumeRoleWithWebIdentity.
type AWSWebIdentity struct {
	// RoleARN is the role assumed.
	RoleARN string
	// TokenFile holds the projected service account token; it is read
	// at every exchange, as Kubernetes rotates it.
	TokenFile string
	// SessionName names the role session; the SDK's default when empty.
	SessionName string
	// STSEndpoint and ECREndpoint, when set, replace the regional
	// endpoints (AWS_ENDPOINT_URL_STS, AWS_ENDPOINT_URL_ECR or
	// AWS_ENDPOINT_URL).
	STSEndpoint, ECREndpoint string
	// Token, when set, gives the web identity token instead of TokenFile:
	// a token of a source's ServiceAccount (object-level workload
	// identity), asked for at every exchange.
	Token func(context.Context) (string, error)
	// Subject names the ServiceAccount of Token (namespace/name), part of
	// the cache key; empty for the fetcher's own identity.
	Subject string
}

// AWSEndpointsFromEnv returns a web identity without role or token, with
// the STS and ECR endpoints of the environment through lookup
// (os.LookupEnv when nil): AWS_ENDPOINT_URL_STS, AWS_ENDPOINT_URL_ECR, or
// AWS_ENDPOINT_URL for both.
func AWSEndpointsFromEnv(lookup func(string) (string, bool)) *AWSWebIdentity {
	if lookup == nil {
		lookup = os.LookupEnv
	}
	get := func(k string) string { v, _ := lookup(k); return strings.TrimSpace(v) }
	id := &AWSWebIdentity{STSEndpoint: get(EnvAWSEndpointURLSTS), ECREndpoint: get(EnvAWSEndpointURLECR)}
	if global := get(EnvAWSEndpointURL); global != "" {
		if id.STSEndpoint == "" {
			id.STSEndpoint = global
		}
		if id.ECREndpoint == "" {
			id.ECREndpoint = global
		}
	}
	return id
}

// AWSWebIdentityFromEnv reads the web identity from the environment
// through lookup (os.LookupEnv when nil). It needs AWS_ROLE_ARN and
// AWS_WEB_IDENTITY_TOKEN_FILE (IRSA); faults are *ConfigError values.
func AWSWebIdentityFromEnv(lookup func(string) (string, bool)) (*AWSWebIdentity, error) {
	if lookup == nil {
		lookup = os.LookupEnv
	}
	get := func(k string) string { v, _ := lookup(k); return strings.TrimSpace(v) }
	id := &AWSWebIdentity{RoleARN: get(EnvAWSRoleARN), TokenFile: get(EnvAWSWebIdentityTokenFile), SessionName: get(EnvAWSRoleSessionName)}
	if id.RoleARN == "" || id.TokenFile == "" {
		return nil, configErrorf("no AWS web identity: the fetcher has no %s and %s in its environment: "+
			"annotate its service account with eks.amazonaws.com/role-arn (IAM Roles for Service Accounts) and restart it",
			EnvAWSRoleARN, EnvAWSWebIdentityTokenFile)
	}
	if !strings.HasPrefix(id.RoleARN, "arn:") {
		return nil, configErrorf("invalid %s '%s': must be an IAM role ARN (arn:aws:iam::<account>:role/<name>)", EnvAWSRoleARN, id.RoleARN)
	}
	global := get(EnvAWSEndpointURL)
	id.STSEndpoint, id.ECREndpoint = get(EnvAWSEndpointURLSTS), get(EnvAWSEndpointURLECR)
	if id.STSEndpoint == "" {
		id.STSEndpoint = global
	}
	if id.ECREndpoint == "" {
		id.ECREndpoint = global
	}
	return id, nil
}

// ECRLogin returns the user name and password of ECR's registries in
// region for the role, from cache when reusable, else by assuming the role
// with STS and asking ECR's GetAuthorizationToken, both through client.
// scope (a namespace) is part of the cache key, so a login is only reused
// within it.
func (w *AWSWebIdentity) ECRLogin(ctx context.Context, client *http.Client, cache *Cache, scope, region string) (Login, error) {
	key := Key(ProviderAWS, scope, w.Subject, w.RoleARN, w.TokenFile, w.SessionName, w.STSEndpoint, w.ECREndpoint, region)
	t, err := cache.Get(ctx, ProviderAWS, key, func(ctx context.Context) (Token, error) {
		creds, err := w.assumeRole(ctx, client, region)
		if err != nil {
			return Token{}, err
		}
		return w.authorizationToken(ctx, client, creds, region)
	})
	if err != nil {
		return Login{}, err
	}
	return loginOf(t), nil
}

// webIdentityToken is the service account token: Token's, else
// TokenFile's content.
func (w *AWSWebIdentity) webIdentityToken(ctx context.Context) (string, error) {
	if w.Token != nil {
		return w.Token(ctx)
	}
	token, err := os.ReadFile(w.TokenFile)
	if err != nil {
		return "", &ConfigError{Err: fmt.Errorf("failed to read the web identity token file: %w", err)}
	}
	return string(token), nil
}

// Credentials returns temporary credentials of the role in region, from
// cache when reusable, else by assuming the role with STS through client.
// scope (a namespace) is part of the cache key.
func (w *AWSWebIdentity) Credentials(ctx context.Context, client *http.Client, cache *Cache, scope, region string) (AWSCredentials, error) {
	key := Key(ProviderAWS, "credentials", scope, w.Subject, w.RoleARN, w.TokenFile, w.SessionName, w.STSEndpoint, region)
	t, err := cache.Get(ctx, ProviderAWS, key, func(ctx context.Context) (Token, error) {
		creds, err := w.assumeRole(ctx, client, region)
		if err != nil {
			return Token{}, err
		}
		b, err := json.Marshal(creds)
		if err != nil {
			return Token{}, err
		}
		return Token{Value: string(b), ExpiresAt: creds.ExpiresAt}, nil
	})
	if err != nil {
		return AWSCredentials{}, err
	}
	var creds AWSCredentials
	if err := json.Unmarshal([]byte(t.Value), &creds); err != nil {
		return AWSCredentials{}, fmt.Errorf("cached AWS credentials: %w", err)
	}
	return creds, nil
}

// assumeRole calls STS's AssumeRoleWithWebIdentity with the service
// account token, as the SDK's web identity credential provider does.
func (w *AWSWebIdentity) assumeRole(ctx context.Context, client *http.Client, region string) (AWSCredentials, error) {
	token, err := w.webIdentityToken(ctx)
	if err != nil {
		return AWSCredentials{}, err
	}
	session := w.SessionName
	if session == "" {
		session = "aws-go-sdk-" + strconv.FormatInt(time.Now().UnixNano(), 10)
	}
	o := sts.Options{Region: region, HTTPClient: client, Retryer: aws.NopRetryer{}}
	if w.STSEndpoint != "" {
		o.BaseEndpoint = aws.String(w.STSEndpoint)
	}
	out, err := sts.New(o).AssumeRoleWithWebIdentity(ctx, &sts.AssumeRoleWithWebIdentityInput{
		RoleArn:          aws.String(w.RoleARN),
		RoleSessionName:  aws.String(session),
		WebIdentityToken: aws.String(strings.TrimSpace(string(token))),
	})
	if err != nil {
		return AWSCredentials{}, awsError("failed to retrieve credentials", err)
	}
	c := out.Credentials
	if c == nil || c.AccessKeyId == nil || c.SecretAccessKey == nil || c.SessionToken == nil || c.Expiration == nil {
		return AWSCredentials{}, errors.New("failed to retrieve credentials: STS answered without credentials")
	}
	return AWSCredentials{AccessKeyID: *c.AccessKeyId, SecretAccessKey: *c.SecretAccessKey,
		SessionToken: *c.SessionToken, ExpiresAt: *c.Expiration}, nil
}

// authorizationToken asks ECR's GetAuthorizationToken, signed with creds,
// for the login of its registries in region: a token whose value is
// "user:password".
func (w *AWSWebIdentity) authorizationToken(ctx context.Context, client *http.Client, creds AWSCredentials, region string) (Token, error) {
	o := ecr.Options{Region: region, HTTPClient: client, Retryer: aws.NopRetryer{},
		Credentials: aws.CredentialsProviderFunc(func(context.Context) (aws.Credentials, error) {
			return aws.Credentials{AccessKeyID: creds.AccessKeyID, SecretAccessKey: creds.SecretAccessKey,
				SessionToken: creds.SessionToken, CanExpire: true, Expires: creds.ExpiresAt, Source: "WebIdentityCredentials"}, nil
		})}
	if w.ECREndpoint != "" {
		o.BaseEndpoint = aws.String(w.ECREndpoint)
	}
	out, err := ecr.New(o).GetAuthorizationToken(ctx, &ecr.GetAuthorizationTokenInput{})
	if err != nil {
		return Token{}, awsError("failed to get the ECR authorization token", err)
	}
	if len(out.AuthorizationData) == 0 || out.AuthorizationData[0].AuthorizationToken == nil || out.AuthorizationData[0].ExpiresAt == nil {
		return Token{}, errors.New("ECR answered without authorization data")
	}
	raw, err := base64.StdEncoding.DecodeString(*out.AuthorizationData[0].AuthorizationToken)
	if err != nil {
		return Token{}, fmt.Errorf("failed to parse authorization token: %w", err)
	}
	if !strings.Contains(string(raw), ":") {
		return Token{}, errors.New("invalid authorization token format")
	}
	return Token{Value: string(raw), ExpiresAt: *out.AuthorizationData[0].ExpiresAt}, nil
}

// awsError wraps an AWS SDK error: an answer of the service (its status,
// request ID and error code, as the SDK words them) becomes a
// *ResponseError, so Refused tells a refusal from an outage.
func awsError(what string, err error) error {
	var re *awshttp.ResponseError
	if errors.As(err, &re) {
		msg := what + ": " + err.Error()
		return &ResponseError{StatusCode: re.HTTPStatusCode(), Message: msg,
			format: func(e *ResponseError) string { return e.Message }}
	}
	return fmt.Errorf("%s: %w", what, err)
}

// Login is a registry's user name and password, and when they expire.
type Login struct {
	Username, Password string
	ExpiresAt          time.Time
}

// loginOf splits a token whose value is "user:password".
func loginOf(t Token) Login {
	user, password, _ := strings.Cut(t.Value, ":")
	return Login{Username: user, Password: password, ExpiresAt: t.ExpiresAt}
}
