// Package workloadidentity gives a source the cloud identity of a
// Kubernetes ServiceAccount of its own namespace (object-level workload
// identity, as Flux's fluxcd/pkg/auth has it behind the
// ObjectLevelWorkloadIdentity feature gate): a source with spec.provider
// aws, azure or gcp and spec.serviceAccountName, or any such source when
// the operator sets -default-service-account, authenticates with a token
// of that ServiceAccount, requested from the TokenRequest API for the
// cloud's audience and exchanged with the cloud:
//
//   - aws: audience sts.amazonaws.com; STS AssumeRoleWithWebIdentity of
//     the role the annotation eks.amazonaws.com/role-arn names, session
//     <name>.<namespace>.<region>.fluxcd.io;
//   - azure: audience api://AzureADTokenExchange; an Entra ID client
//     assertion for the application of the annotations
//     azure.workload.identity/client-id and azure.workload.identity/tenant-id;
//   - gcp: audience the workload identity provider of the annotation
//     gcp.auth.fluxcd.io/workload-identity-provider, else on GKE the
//     cluster's workload identity pool (<project>.svc.id.goog); Google's
//     STS token exchange, then, when the annotation
//     iam.gke.io/gcp-service-account names a Google service account, its
//     impersonation (IAM Credentials' generateAccessToken).
//
// The ServiceAccount is always in the source's namespace: a tenant can
// only borrow an identity of its own. Service account tokens are asked for
// at each exchange and never kept; what the cloud returns goes to the
// fetcher's token cache under a key that names the namespace and the
// ServiceAccount, and never leaves the process.
package workloadidentity

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strings"

	"github.com/fluxcd/pkg/apis/meta"
	sourcev1 "github.com/fluxcd/source-controller/api/v1"
	authnv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/headwater-gitops/headwater/pkg/failure"
	"github.com/headwater-gitops/headwater/services/fetcher/internal/providertoken"
	"github.com/headwater-gitops/headwater/services/fetcher/internal/source"
)

// Annotations of a ServiceAccount that name its cloud identity, as the
// clouds' own webhooks read them and Flux does.
const (
	AnnotationAWSRoleARN                  = "eks.amazonaws.com/role-arn"
	AnnotationAzureClientID               = "azure.workload.identity/client-id"
	AnnotationAzureTenantID               = "azure.workload.identity/tenant-id"
	AnnotationGCPServiceAccount           = "iam.gke.io/gcp-service-account"
	AnnotationGCPWorkloadIdentityProvider = "gcp.auth.fluxcd.io/workload-identity-provider"
)

// Flux's patterns of the gcp annotations.
const (
	gcpEmailPattern    = `^[a-zA-Z0-9-]{1,100}@[a-zA-Z0-9-]{1,100}\.iam\.gserviceaccount\.com$`
	gcpProviderPattern = `^projects/\d{1,30}/locations/global/workloadIdentityPools/[^/]{1,100}/providers/[^/]{1,100}$`
)

var (
	gcpEmail    = regexp.MustCompile(gcpEmailPattern)
	gcpProvider = regexp.MustCompile(gcpProviderPattern)
)

// Audiences of the service account tokens each cloud accepts, as Flux
// asks for them.
const (
	AudienceAWS   = "sts.amazonaws.com"
	AudienceAzure = "api://AzureADTokenExchange"
)

// GateMessage is Flux's message for a source that names a ServiceAccount
// for a cloud provider while the gate is off.
const GateMessage = "to use spec.serviceAccountName for provider authentication please enable the ObjectLevelWorkloadIdentity feature gate in the controller"

// defaultNotFound is Flux's word for a default service account missing
// from the source's namespace (fluxcd/pkg/auth's ErrDefaultServiceAccountNotFound).
const defaultNotFound = "the specified default service account does not exist in the object namespace. " +
	"your cluster is subject to multi-tenant workload identity lockdown, reach out to your cluster administrator for help"

// roleARNPattern is what Flux accepts as an IAM role ARN.
const roleARNPattern = `^arn:aws:iam::[0-9]{1,30}:role/.{1,200}$`

var roleARN = regexp.MustCompile(roleARNPattern)

// Accounts resolves the ServiceAccount a source authenticates as and
// requests its tokens.
type Accounts struct {
	// Client reads ServiceAccounts and creates their tokens (RBAC: get on
	// serviceaccounts, create on serviceaccounts/token). Nil when the
	// fetcher has no cluster.
	Client client.Client
	// Enabled is the ObjectLevelWorkloadIdentity feature gate.
	Enabled bool
	// Default is -default-service-account: the ServiceAccount of a
	// source's namespace that sources naming none authenticate as (Flux's
	// multi-tenancy lockdown). Only with Enabled.
	Default string
}

// Account is a ServiceAccount a source authenticates as.
type Account struct {
	// Namespace and Name name it; Namespace is the source's.
	Namespace, Name string
	// Annotations are its annotations, naming its cloud identities.
	Annotations map[string]string

	client client.Client
}

// String is namespace/name.
func (a *Account) String() string { return a.Namespace + "/" + a.Name }

// Subject is the token's subject, as the clouds' trust policies name it.
func (a *Account) Subject() string { return "system:serviceaccount:" + a.Namespace + ":" + a.Name }

// Resolve returns the ServiceAccount a source of namespace with the
// given spec.serviceAccountName authenticates as with a cloud provider:
// nil for the fetcher's own identity (no name and no default). With the
// gate off, a name stalls the source with Flux's FeatureGateDisabled. A
// ServiceAccount that cannot be read fails the job for good (its next
// reconcile tries again): the tenant may create it.
func (a *Accounts) Resolve(ctx context.Context, namespace, name string) (*Account, error) {
	if a == nil || !a.Enabled {
		if name != "" {
			return nil, source.StalledError(meta.FeatureGateDisabledReason, "%s", GateMessage)
		}
		return nil, nil
	}
	byDefault := false
	if name == "" {
		if a.Default == "" {
			return nil, nil
		}
		name, byDefault = a.Default, true
	}
	key := types.NamespacedName{Namespace: namespace, Name: name}
	if a.Client == nil {
		return nil, source.Failed(sourcev1.AuthenticationFailedReason,
			"failed to get service account '%s': no Kubernetes API server is configured", key)
	}
	var sa corev1.ServiceAccount
	if err := a.Client.Get(ctx, key, &sa); err != nil {
		switch {
		case apierrors.IsNotFound(err) && byDefault:
			return nil, source.FailedWith(failure.Final, sourcev1.AuthenticationFailedReason,
				"failed to get service account '%s': %s", key, defaultNotFound)
		case apierrors.IsNotFound(err) || apierrors.IsForbidden(err):
			return nil, source.FailedWith(failure.Final, sourcev1.AuthenticationFailedReason,
				"failed to get service account '%s': %w", key, err)
		}
		return nil, source.Failed(sourcev1.AuthenticationFailedReason, "failed to get service account '%s': %w", key, err)
	}
	return &Account{Namespace: namespace, Name: name, Annotations: sa.Annotations, client: a.Client}, nil
}

// Token requests a token of the ServiceAccount for audience (the API
// server's default lifetime, an hour). Refused (the fetcher's RBAC lacks
// create on serviceaccounts/token: the ObjectLevelWorkloadIdentity
// component is not installed), it is a *providertoken.ConfigError.
func (a *Account) Token(ctx context.Context, audience string) (string, error) {
	sa := &corev1.ServiceAccount{}
	sa.Namespace, sa.Name = a.Namespace, a.Name
	req := &authnv1.TokenRequest{Spec: authnv1.TokenRequestSpec{Audiences: []string{audience}}}
	if err := a.client.SubResource("token").Create(ctx, sa, req); err != nil {
		err = fmt.Errorf("failed to create kubernetes service account token for '%s': %w", a, err)
		if apierrors.IsForbidden(err) || apierrors.IsNotFound(err) {
			return "", &providertoken.ConfigError{Err: err}
		}
		return "", err
	}
	if req.Status.Token == "" {
		return "", fmt.Errorf("failed to create kubernetes service account token for '%s': the API server answered no token", a)
	}
	return req.Status.Token, nil
}

// tokenFor returns a's token source for audience.
func (a *Account) tokenFor(audience string) func(context.Context) (string, error) {
	return func(ctx context.Context) (string, error) { return a.Token(ctx, audience) }
}

// ErrIdentity is the error of a ServiceAccount whose annotations do not
// name a usable identity of the cloud.
var ErrIdentity = errors.New("invalid service account identity")

// identityError is an ErrIdentity with a message of its own.
type identityError struct{ msg string }

func (e *identityError) Error() string        { return e.msg }
func (e *identityError) Is(target error) bool { return target == ErrIdentity }

func identityErrorf(a *Account, format string, args ...any) error {
	return &identityError{msg: fmt.Sprintf("failed to get provider identity from service account '%s' annotations: ", a) +
		fmt.Sprintf(format, args...)}
}

// AWS is the AWS web identity of the ServiceAccount for a region: the role
// of its eks.amazonaws.com/role-arn annotation, assumed with its token.
// STS's endpoint is the fetcher's (AWS_ENDPOINT_URL_STS or
// AWS_ENDPOINT_URL through lookup, else the region's).
func (a *Account) AWS(region string, lookup func(string) (string, bool)) (*providertoken.AWSWebIdentity, error) {
	arn := strings.TrimSpace(a.Annotations[AnnotationAWSRoleARN])
	if !roleARN.MatchString(arn) {
		return nil, identityErrorf(a, "invalid AWS role ARN: '%s'. must match %s (annotation %s)", arn, roleARNPattern, AnnotationAWSRoleARN)
	}
	id := providertoken.AWSEndpointsFromEnv(lookup)
	id.RoleARN, id.Token, id.Subject = arn, a.tokenFor(AudienceAWS), a.String()
	id.SessionName = fmt.Sprintf("%s.%s.%s.fluxcd.io", a.Name, a.Namespace, region)
	return id, nil
}

// Azure is the Entra ID workload identity of the ServiceAccount: the
// application of its azure.workload.identity annotations, with its token
// as client assertion. The authority is the fetcher's
// (AZURE_AUTHORITY_HOST through lookup, else Entra ID's public cloud).
func (a *Account) Azure(lookup func(string) (string, bool)) (*providertoken.AzureWorkloadIdentity, error) {
	clientID := strings.TrimSpace(a.Annotations[AnnotationAzureClientID])
	tenantID := strings.TrimSpace(a.Annotations[AnnotationAzureTenantID])
	if clientID == "" || tenantID == "" {
		return nil, identityErrorf(a, "the annotations %s and %s must both be set", AnnotationAzureClientID, AnnotationAzureTenantID)
	}
	id, err := providertoken.AzureAccountIdentity(clientID, tenantID, lookup)
	if err != nil {
		return nil, identityErrorf(a, "%s", err.Error())
	}
	id.Assertion, id.Subject = a.tokenFor(AudienceAzure), a.String()
	return id, nil
}

// GCP is the Google Cloud identity of the ServiceAccount (Workload
// Identity Federation): its token exchanged at Google's STS and, with the
// annotation iam.gke.io/gcp-service-account, that service account
// impersonated. The audience is the provider of the annotation
// gcp.auth.fluxcd.io/workload-identity-provider, else the GKE cluster's
// (from the metadata server). The STS, IAM Credentials and metadata
// endpoints are the fetcher's (HEADWATER_GCP_STS_ENDPOINT,
// HEADWATER_GCP_IAM_CREDENTIALS_ENDPOINT and GCE_METADATA_HOST through
// lookup, else Google's).
func (a *Account) GCP(lookup func(string) (string, bool)) (*providertoken.GCPFederation, error) {
	id := providertoken.GCPEndpointsFromEnv(lookup)
	if email := a.Annotations[AnnotationGCPServiceAccount]; email != "" {
		if !gcpEmail.MatchString(email) {
			return nil, identityErrorf(a, "invalid %s annotation: '%s'. must match %s", AnnotationGCPServiceAccount, email, gcpEmailPattern)
		}
		id.Email = email
	}
	if wip := a.Annotations[AnnotationGCPWorkloadIdentityProvider]; wip != "" {
		if !gcpProvider.MatchString(wip) {
			return nil, identityErrorf(a, "invalid %s annotation: '%s'. must match %s", AnnotationGCPWorkloadIdentityProvider, wip, gcpProviderPattern)
		}
		id.Provider = "//iam.googleapis.com/" + wip
	}
	id.Token, id.Subject = a.Token, a.String()
	return id, nil
}

// Handling is how a fetch handles a failed exchange with a
// ServiceAccount: an identity its annotations do not name, a token the API
// server refuses (no RBAC) and a cloud's refusal fail for good in this job
// (the next reconcile tries again: the annotations, RBAC or trust may
// change); an outage is retried.
func Handling(err error) failure.Handling {
	var cfg *providertoken.ConfigError
	if errors.Is(err, ErrIdentity) || errors.As(err, &cfg) || providertoken.Refused(err) {
		return failure.Final
	}
	return failure.Transient
}
