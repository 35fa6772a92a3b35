// Package ldapminio runs a MinIO server (miniotest) whose STS grants
// temporary credentials to the people of an LDAP directory (ldapserver),
// with a policy plugin that counts their requests: the peer of the tests
// of a Bucket's spec.sts provider ldap, in the fetcher and end to end.
// It is a package of its own so that miniotest's other users do not
// link an LDAP server.
package ldapminio

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"

	"github.com/headwater-gitops/headwater/testsupport/ldapserver"
	"github.com/headwater-gitops/headwater/testsupport/miniotest"
)

// PolicyPlugin is MinIO's access management plugin
// (MINIO_POLICY_PLUGIN_URL) for tests: it allows every request and counts
// those made with the temporary credentials of each LDAP user (their
// ldapUser claim), so a test sees which identity read a bucket. It stands
// in for the policy an administrator attaches to the user.
type PolicyPlugin struct {
	mu    sync.Mutex
	users map[string]int
}

// ServeHTTP answers MinIO's policy request: allowed.
func (p *PolicyPlugin) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var body struct {
		Input struct {
			Claims map[string]any `json:"claims"`
		} `json:"input"`
	}
	_ = json.NewDecoder(r.Body).Decode(&body)
	if u, ok := body.Input.Claims["ldapUser"].(string); ok {
		p.mu.Lock()
		if p.users == nil {
			p.users = map[string]int{}
		}
		p.users[u]++
		p.mu.Unlock()
	}
	_, _ = w.Write([]byte(`{"result": true}`))
}

// RequestsAs counts the requests made with the temporary credentials of
// the LDAP user dn (ldapserver.UserDN).
func (p *PolicyPlugin) RequestsAs(dn string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.users[dn]
}

// New starts a server as miniotest.New does whose STS grants temporary
// credentials to the people of dir (AssumeRoleWithLDAPIdentity, MinIO
// binding to dir as each), with a PolicyPlugin deciding their requests,
// and waits for its IAM (miniotest.Server.WaitIAM).
func New(tb testing.TB, dir *ldapserver.Server) (*miniotest.Server, *PolicyPlugin) {
	tb.Helper()
	plugin := &PolicyPlugin{}
	front := httptest.NewServer(plugin)
	tb.Cleanup(front.Close)
	s := miniotest.NewWithEnv(tb,
		"MINIO_IDENTITY_LDAP_SERVER_ADDR="+dir.Addr,
		"MINIO_IDENTITY_LDAP_SERVER_INSECURE=on",
		"MINIO_IDENTITY_LDAP_LOOKUP_BIND_DN="+ldapserver.LookupDN,
		"MINIO_IDENTITY_LDAP_LOOKUP_BIND_PASSWORD="+dir.LookupPassword,
		"MINIO_IDENTITY_LDAP_USER_DN_SEARCH_BASE_DN="+ldapserver.PeopleDN,
		"MINIO_IDENTITY_LDAP_USER_DN_SEARCH_FILTER=(uid=%s)",
		"MINIO_POLICY_PLUGIN_URL="+front.URL,
	)
	s.WaitIAM(tb)
	return s, plugin
}
