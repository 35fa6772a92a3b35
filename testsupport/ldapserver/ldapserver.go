// Package ldapserver is a small LDAP directory for tests, built on
// github.com/jimlambrt/gldap: it speaks the LDAP protocol (simple binds and
// searches) over TCP, so a real LDAP client (MinIO's LDAP identity
// provider) authenticates against it as it would against OpenLDAP or
// Active Directory. Its directory is a fixed set of people below one base
// DN, and a service account for lookups.
package ldapserver

import (
	"fmt"
	"io"
	"net"
	"regexp"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/jimlambrt/gldap"
)

// BaseDN is the directory's root; people are uid=<name>,ou=people,BaseDN.
const BaseDN = "dc=headwater,dc=test"

// PeopleDN is the base of the people's entries.
const PeopleDN = "ou=people," + BaseDN

// LookupDN is the service account an LDAP client binds as to look users
// up (MinIO's MINIO_IDENTITY_LDAP_LOOKUP_BIND_DN).
const LookupDN = "cn=lookup," + BaseDN

// Server is a running directory.
type Server struct {
	// Addr is host:port of the plain LDAP listener.
	Addr string
	// LookupPassword is LookupDN's password.
	LookupPassword string

	srv *gldap.Server

	mu       sync.Mutex
	people   map[string]string // uid -> password
	binds    map[string]int    // DN -> successful binds
	searches int
}

// UserDN is the DN of the person uid.
func UserDN(uid string) string { return "uid=" + uid + "," + PeopleDN }

// Start serves a directory with people (uid -> password) on a free port
// of 127.0.0.1 until Stop.
func Start(people map[string]string, lookupPassword string) (*Server, error) {
	s := &Server{LookupPassword: lookupPassword, people: map[string]string{}, binds: map[string]int{}}
	for uid, pw := range people {
		s.people[uid] = pw
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("ldapserver: %w", err)
	}
	s.Addr = ln.Addr().String()
	_ = ln.Close()
	logger := hclog.New(&hclog.LoggerOptions{Output: io.Discard})
	if s.srv, err = gldap.NewServer(gldap.WithLogger(logger)); err != nil {
		return nil, fmt.Errorf("ldapserver: %w", err)
	}
	mux, err := gldap.NewMux()
	if err != nil {
		return nil, fmt.Errorf("ldapserver: %w", err)
	}
	if err := mux.Bind(s.bind); err != nil {
		return nil, fmt.Errorf("ldapserver: %w", err)
	}
	if err := mux.Search(s.search); err != nil {
		return nil, fmt.Errorf("ldapserver: %w", err)
	}
	if err := s.srv.Router(mux); err != nil {
		return nil, fmt.Errorf("ldapserver: %w", err)
	}
	errs := make(chan error, 1)
	go func() { errs <- s.srv.Run(s.Addr) }()
	deadline := time.Now().Add(10 * time.Second)
	for !s.srv.Ready() {
		select {
		case err := <-errs:
			return nil, fmt.Errorf("ldapserver: %w", err)
		case <-time.After(10 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			_ = s.srv.Stop()
			return nil, fmt.Errorf("ldapserver: not ready on %s", s.Addr)
		}
	}
	return s, nil
}

// Stop stops serving.
func (s *Server) Stop() error { return s.srv.Stop() }

// Binds reports how many times dn bound successfully.
func (s *Server) Binds(dn string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.binds[strings.ToLower(dn)]
}

// SetPassword changes (or adds) the password of uid.
func (s *Server) SetPassword(uid, password string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.people[uid] = password
}

func (s *Server) bind(w *gldap.ResponseWriter, r *gldap.Request) {
	resp := r.NewBindResponse(gldap.WithResponseCode(gldap.ResultInvalidCredentials))
	defer func() { _ = w.Write(resp) }()
	m, err := r.GetSimpleBindMessage()
	if err != nil {
		return
	}
	dn := strings.ToLower(m.UserName)
	s.mu.Lock()
	defer s.mu.Unlock()
	ok := dn == strings.ToLower(LookupDN) && string(m.Password) == s.LookupPassword
	if !ok {
		for uid, pw := range s.people {
			if dn == strings.ToLower(UserDN(uid)) && string(m.Password) == pw && pw != "" {
				ok = true
			}
		}
	}
	if ok {
		s.binds[dn]++
		resp.SetResultCode(gldap.ResultSuccess)
	}
}

// uidFilter finds the uid an equality filter asks for.
var uidFilter = regexp.MustCompile(`\(uid=([^)]*)\)`)

// search answers the searches of an LDAP client looking a user up: a
// known entry by its DN (base scope: the base DN, the people's unit, a
// person), and people by "(uid=<name>)" below PeopleDN or BaseDN.
func (s *Server) search(w *gldap.ResponseWriter, r *gldap.Request) {
	resp := r.NewSearchDoneResponse(gldap.WithResponseCode(gldap.ResultSuccess))
	defer func() { _ = w.Write(resp) }()
	m, err := r.GetSearchMessage()
	if err != nil {
		resp.SetResultCode(gldap.ResultProtocolError)
		return
	}
	base := strings.ToLower(m.BaseDN)
	s.mu.Lock()
	s.searches++
	var uids []string
	for uid := range s.people {
		dn := strings.ToLower(UserDN(uid))
		switch {
		case base == dn:
			uids = append(uids, uid)
		case m.Scope != gldap.BaseObject && (strings.HasSuffix(dn, ","+base)):
			for _, f := range uidFilter.FindAllStringSubmatch(m.Filter, -1) {
				if strings.EqualFold(f[1], uid) {
					uids = append(uids, uid)
				}
			}
		}
	}
	s.mu.Unlock()
	if m.Scope == gldap.BaseObject {
		switch base {
		case strings.ToLower(BaseDN):
			_ = w.Write(r.NewSearchResponseEntry(BaseDN, gldap.WithAttributes(map[string][]string{"objectClass": {"top", "domain"}})))
			return
		case strings.ToLower(PeopleDN):
			_ = w.Write(r.NewSearchResponseEntry(PeopleDN, gldap.WithAttributes(map[string][]string{"objectClass": {"top", "organizationalUnit"}})))
			return
		}
		if len(uids) == 0 {
			resp.SetResultCode(gldap.ResultNoSuchObject)
			return
		}
	}
	for _, uid := range uids {
		_ = w.Write(r.NewSearchResponseEntry(UserDN(uid), gldap.WithAttributes(map[string][]string{
			"objectClass": {"top", "person", "inetOrgPerson"},
			"uid":         {uid},
			"cn":          {uid},
		})))
	}
}
