package cloudid

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"
)

// Claims are the claims of a Kubernetes service account token the clouds
// check.
type Claims struct {
	Subject  string   `json:"sub"`
	Audience []string `json:"aud"`
	Expiry   int64    `json:"exp"`
}

// ServiceAccountClaims reads the claims of a service account token (a
// JWT) without verifying its signature.
func ServiceAccountClaims(token string) (Claims, error) {
	parts := strings.Split(token, ".")
	if len(parts) != 3 {
		return Claims{}, fmt.Errorf("not a JWT")
	}
	raw, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil {
		return Claims{}, fmt.Errorf("JWT payload: %w", err)
	}
	var c Claims
	if err := json.Unmarshal(raw, &c); err != nil {
		return Claims{}, fmt.Errorf("JWT claims: %w", err)
	}
	return c, nil
}

// ServiceAccountTrust is the trust a cloud places in Kubernetes
// ServiceAccounts: identity (a role ARN, an application's client ID)
// trusts the token of the ServiceAccount "namespace/name" that trusts[identity]
// names, if the token is for audience and has not expired, as an IAM role's
// trust policy or an Entra ID federated credential checks sub and aud. The
// token's signature is the API server's and is not checked here.
func ServiceAccountTrust(audience string, trusts map[string]string) func(identity, token string) error {
	return func(identity, token string) error {
		account, ok := trusts[identity]
		if !ok {
			return fmt.Errorf("no trust for %s", identity)
		}
		c, err := ServiceAccountClaims(token)
		if err != nil {
			return err
		}
		ns, name, _ := strings.Cut(account, "/")
		if want := "system:serviceaccount:" + ns + ":" + name; c.Subject != want {
			return fmt.Errorf("subject %q, want %q", c.Subject, want)
		}
		if !slices.Contains(c.Audience, audience) {
			return fmt.Errorf("audience %q, want %q", c.Audience, audience)
		}
		if time.Unix(c.Expiry, 0).Before(time.Now()) {
			return fmt.Errorf("token expired")
		}
		return nil
	}
}

// PoolTrust is a workload identity pool's trust for GCPSTS.Trust: it
// accepts the token of any of accounts (namespace/name) for audience, the
// pool's, whatever STS audience it is exchanged for.
func PoolTrust(audience string, accounts ...string) func(stsAudience, token string) error {
	return func(_, token string) error {
		var err error
		for _, a := range accounts {
			if err = ServiceAccountTrust(audience, map[string]string{"": a})("", token); err == nil {
				return nil
			}
		}
		if err == nil {
			err = fmt.Errorf("no service account is trusted")
		}
		return err
	}
}
