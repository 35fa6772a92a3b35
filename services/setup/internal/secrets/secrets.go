// Package secrets makes the Secrets a Headwater installation needs before
// its pods can start: every bus identity's NKey seed, the NATS server's
// list of their public keys and, optionally, the S3 settings of an
// in-cluster object store. Ensure creates in a cluster only what is
// missing; Generate makes a fresh set to print.
package secrets

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"maps"
	"slices"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/util/retry"

	"github.com/headwater-gitops/headwater/pkg/events"
	"github.com/headwater-gitops/headwater/pkg/natskeys"
)

// S3 describes the Secret of the s3 storage backend's settings, with the
// keys the services read (deploy/base): endpoint, bucket, accesskey,
// secretkey and, when set, region and insecure. The access and secret keys
// are made at random: they are the root credentials of the in-cluster
// MinIO (deploy/components/minio), which reads them from the same Secret.
type S3 struct {
	// Secret is the Secret's name, e.g. headwater-s3.
	Secret string
	// Endpoint is the S3 endpoint (host[:port] or http(s)://host[:port]).
	Endpoint string
	// Bucket holds the artifacts.
	Bucket string
	// Region is the bucket's region; empty leaves the key out.
	Region string
	// Insecure makes the services talk plain HTTP to a host[:port]
	// endpoint.
	Insecure bool
}

// Spec is what an installation needs.
type Spec struct {
	// Namespace holds the Secrets.
	Namespace string
	// S3, when not nil, asks for the S3 Secret too.
	S3 *S3
	// PluginKinds are the plug-in source kinds whose fetchers get a bus
	// identity too (events.PluginIdentity), e.g. "HTTPSource".
	PluginKinds []string
}

// identities are the bus identities of the installation: the built-in
// ones and the plug-in fetchers'.
func (s Spec) identities() []string {
	ids := events.Identities()
	for _, k := range s.PluginKinds {
		ids = append(ids, events.PluginIdentity(k))
	}
	return ids
}

// Validate reports a Spec that cannot be made.
func (s Spec) Validate() error {
	if s.Namespace == "" {
		return errors.New("a namespace is required")
	}
	if s.S3 == nil {
		return nil
	}
	if s.S3.Secret == "" || s.S3.Endpoint == "" || s.S3.Bucket == "" {
		return errors.New("the S3 Secret needs a name, an endpoint and a bucket")
	}
	return nil
}

// Action is what Ensure did to one Secret.
type Action struct {
	// Secret is the Secret's name.
	Secret string
	// Verb is "created" or "updated".
	Verb string
}

// Ensure creates in the cluster the Secrets of spec that are missing and
// never replaces an existing key or seed:
//
//   - one seed Secret per identity (natskeys.SeedSecret) with a fresh
//     NKey where none exists;
//   - natskeys.UsersSecret with every identity's public key, computed from
//     the seed Secrets: missing entries are added and an entry that no
//     longer matches its seed (the seed Secret was deleted to rotate the
//     key) is corrected; other entries are kept;
//   - with spec.S3, the S3 Secret with random credentials, if missing.
//
// It is idempotent and safe to run concurrently (two setup Jobs, or a Job
// and an operator): a create that loses a race re-reads the winner's
// Secret, and the users Secret is updated with optimistic concurrency.
func Ensure(ctx context.Context, c typedcorev1.SecretsGetter, spec Spec) ([]Action, error) {
	if err := spec.Validate(); err != nil {
		return nil, err
	}
	client := c.Secrets(spec.Namespace)
	var actions []Action
	public := map[string]string{}
	for _, id := range spec.identities() {
		pub, created, err := ensureSeed(ctx, client, spec.Namespace, id)
		if err != nil {
			return actions, err
		}
		if created {
			actions = append(actions, Action{natskeys.SeedSecret(id), "created"})
		}
		public[natskeys.EnvVar(id)] = pub
	}
	verb, err := ensureUsers(ctx, client, spec.Namespace, public)
	if err != nil {
		return actions, err
	}
	if verb != "" {
		actions = append(actions, Action{natskeys.UsersSecret, verb})
	}
	if spec.S3 != nil {
		created, err := createIfMissing(ctx, client, spec.S3.Secret, func() (*corev1.Secret, error) { return s3Secret(spec.Namespace, *spec.S3), nil })
		if err != nil {
			return actions, err
		}
		if created {
			actions = append(actions, Action{spec.S3.Secret, "created"})
		}
	}
	return actions, nil
}

// ensureSeed returns the public key of identity's seed, creating its
// Secret with a fresh key if there is none.
func ensureSeed(ctx context.Context, client typedcorev1.SecretInterface, namespace, identity string) (public string, created bool, err error) {
	name := natskeys.SeedSecret(identity)
	var made string
	created, err = createIfMissing(ctx, client, name, func() (*corev1.Secret, error) {
		pub, seed, err := natskeys.NewUser()
		if err != nil {
			return nil, err
		}
		made = pub
		return secret(namespace, name, map[string]string{natskeys.SeedKey: seed}), nil
	})
	if err != nil {
		return "", false, err
	}
	if created {
		return made, true, nil
	}
	s, err := client.Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return "", false, fmt.Errorf("get Secret %s/%s: %w", namespace, name, err)
	}
	public, err = natskeys.PublicKey(string(s.Data[natskeys.SeedKey]))
	if err != nil {
		// Never replace it: the operator put it there.
		return "", false, fmt.Errorf("secret %s/%s key %s: %w (delete the Secret to make a new key)", namespace, name, natskeys.SeedKey, err)
	}
	return public, false, nil
}

// ensureUsers makes natskeys.UsersSecret hold public (variable -> key),
// keeping its other entries. It returns "created", "updated" or "" (it
// was right already).
func ensureUsers(ctx context.Context, client typedcorev1.SecretInterface, namespace string, public map[string]string) (string, error) {
	created, err := createIfMissing(ctx, client, natskeys.UsersSecret, func() (*corev1.Secret, error) {
		return secret(namespace, natskeys.UsersSecret, public), nil
	})
	if err != nil {
		return "", err
	}
	if created {
		return "created", nil
	}
	updated := false
	err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
		s, err := client.Get(ctx, natskeys.UsersSecret, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if s.Data == nil {
			s.Data = map[string][]byte{}
		}
		changed := false
		for _, name := range slices.Sorted(maps.Keys(public)) {
			if string(s.Data[name]) != public[name] {
				s.Data[name] = []byte(public[name])
				changed = true
			}
		}
		if !changed {
			return nil
		}
		// The resourceVersion read above makes a concurrent change a
		// conflict, retried on a fresh read.
		if _, err := client.Update(ctx, s, metav1.UpdateOptions{}); err != nil {
			return err
		}
		updated = true
		return nil
	})
	if err != nil {
		return "", fmt.Errorf("update Secret %s/%s: %w", namespace, natskeys.UsersSecret, err)
	}
	if updated {
		return "updated", nil
	}
	return "", nil
}

// createIfMissing creates the Secret build returns unless the Secret name
// exists. build is called only when it is missing. created is false
// when it existed, or another writer created it first.
func createIfMissing(ctx context.Context, client typedcorev1.SecretInterface, name string, build func() (*corev1.Secret, error)) (created bool, err error) {
	// A re-run mostly finds the Secret: read before making a key.
	if _, err := client.Get(ctx, name, metav1.GetOptions{}); err == nil {
		return false, nil
	} else if !apierrors.IsNotFound(err) {
		return false, fmt.Errorf("get Secret %s: %w", name, err)
	}
	s, err := build()
	if err != nil {
		return false, err
	}
	if _, err := client.Create(ctx, s, metav1.CreateOptions{}); err != nil {
		if apierrors.IsAlreadyExists(err) {
			return false, nil
		}
		return false, fmt.Errorf("create Secret %s: %w", name, err)
	}
	return true, nil
}

// Generate returns a fresh set of every Secret of spec, for `setup print`:
// the users Secret, one seed Secret per identity and, with spec.S3, the
// S3 Secret.
func Generate(spec Spec) ([]*corev1.Secret, error) {
	if err := spec.Validate(); err != nil {
		return nil, err
	}
	keys, err := natskeys.Generate(spec.identities()[len(events.Identities()):]...)
	if err != nil {
		return nil, err
	}
	users := map[string]string{}
	for _, id := range spec.identities() {
		users[natskeys.EnvVar(id)] = keys.Public[id]
	}
	out := []*corev1.Secret{secret(spec.Namespace, natskeys.UsersSecret, users)}
	for _, id := range spec.identities() {
		out = append(out, secret(spec.Namespace, natskeys.SeedSecret(id), map[string]string{natskeys.SeedKey: keys.Seed[id]}))
	}
	if spec.S3 != nil {
		out = append(out, s3Secret(spec.Namespace, *spec.S3))
	}
	return out, nil
}

// s3Secret is the S3 Secret of o with fresh random credentials.
func s3Secret(namespace string, o S3) *corev1.Secret {
	data := map[string]string{"endpoint": o.Endpoint, "bucket": o.Bucket, "accesskey": randomString(20), "secretkey": randomString(40)}
	if o.Region != "" {
		data["region"] = o.Region
	}
	if o.Insecure {
		data["insecure"] = "true"
	}
	return secret(namespace, o.Secret, data)
}

// randomString returns n random characters of crypto/rand.Text's alphabet
// (5 bits each). n of at most 20 and 40 suit MinIO's root user and
// password.
func randomString(n int) string {
	var s string
	for len(s) < n {
		s += rand.Text()
	}
	return s[:n]
}

// secret is an Opaque Secret, labelled as Headwater's.
func secret(namespace, name string, data map[string]string) *corev1.Secret {
	s := &corev1.Secret{
		TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Secret"},
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace,
			Labels: map[string]string{"app.kubernetes.io/part-of": "headwater", "app.kubernetes.io/managed-by": "headwater-setup"}},
		Type: corev1.SecretTypeOpaque,
		Data: map[string][]byte{},
	}
	for k, v := range data {
		s.Data[k] = []byte(v)
	}
	return s
}
