package ldapserver

import (
	"testing"

	"github.com/go-ldap/ldap/v3"
)

// TestDirectory answers an LDAP client as MinIO's identity provider asks:
// the lookup account binds, a person is found by uid and binds with the
// right password only, and a base search finds the people's unit.
func TestDirectory(t *testing.T) {
	s, err := Start(map[string]string{"carol": "secret"}, "lookup-pw")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Stop() })
	conn, err := ldap.DialURL("ldap://" + s.Addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if err := conn.Bind(LookupDN, "wrong"); !ldap.IsErrorWithCode(err, ldap.LDAPResultInvalidCredentials) {
		t.Errorf("lookup bind with a wrong password: %v", err)
	}
	if err := conn.Bind(LookupDN, "lookup-pw"); err != nil {
		t.Fatalf("lookup bind: %v", err)
	}
	res, err := conn.Search(ldap.NewSearchRequest(PeopleDN, ldap.ScopeWholeSubtree, ldap.NeverDerefAliases, 0, 0, false,
		"(uid=carol)", []string{"uid"}, nil))
	if err != nil || len(res.Entries) != 1 || res.Entries[0].DN != UserDN("carol") {
		t.Fatalf("search (uid=carol): %v %+v", err, res)
	}
	res, err = conn.Search(ldap.NewSearchRequest(PeopleDN, ldap.ScopeBaseObject, ldap.NeverDerefAliases, 0, 0, false,
		"(objectClass=*)", nil, nil))
	if err != nil || len(res.Entries) != 1 || res.Entries[0].DN != PeopleDN {
		t.Fatalf("base search of %s: %v %+v", PeopleDN, err, res)
	}
	if err := conn.Bind(UserDN("carol"), "guess"); !ldap.IsErrorWithCode(err, ldap.LDAPResultInvalidCredentials) {
		t.Errorf("bind with a wrong password: %v", err)
	}
	if err := conn.Bind(UserDN("carol"), "secret"); err != nil {
		t.Fatalf("bind as carol: %v", err)
	}
	if n := s.Binds(UserDN("carol")); n != 1 {
		t.Errorf("binds as carol = %d, want 1", n)
	}
}
