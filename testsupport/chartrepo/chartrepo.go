// Package chartrepo is a Helm chart repository for tests: it packages
// charts with the Helm library, indexes them as `helm repo index` does and
// serves the index and the charts over HTTP or HTTPS, with basic auth when
// asked, answering conditional requests for the index (ETag and
// Last-Modified) as a real repository does. It counts index downloads and
// 304s, so tests can tell a download from a revalidation.
package chartrepo

import (
	"bytes"
	"crypto/sha256"
	"crypto/subtle"
	"crypto/tls"
	"encoding/hex"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"path"
	"path/filepath"
	"sync"
	"time"

	"helm.sh/helm/v3/pkg/chart"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/repo"
	"sigs.k8s.io/yaml"

	"github.com/headwater-gitops/headwater/testsupport/testca"
)

// Server is a chart repository. Set the fields before Start.
type Server struct {
	// Dir holds the packaged charts; a temporary directory when empty.
	Dir string
	// Username and Password, when set, are required (basic auth) for
	// every request.
	Username, Password string
	// TLS serves HTTPS with a certificate from an authority of the
	// server's own (CACert); RequireClientCert also requires a client
	// certificate from it (ClientCert).
	TLS, RequireClientCert bool
	// Lazy is the server's authority (CACert, ClientCert), made on first
	// use.
	testca.Lazy

	mu          sync.Mutex
	index       []byte // served as index.yaml
	etag        string
	modified    time.Time
	downloads   int // index requests answered 200
	notModified int // index requests answered 304
	chartGets   int
	srv         *http.Server
	url         string
}

// Start serves on addr ("127.0.0.1:0" picks a free port) until Stop. The
// repository starts with an empty index.
func (s *Server) Start(addr string) error {
	if s.Dir == "" {
		dir, err := os.MkdirTemp("", "chartrepo-")
		if err != nil {
			return err
		}
		s.Dir = dir
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("chart repository: %w", err)
	}
	s.srv = &http.Server{Handler: http.HandlerFunc(s.serve), ReadHeaderTimeout: 10 * time.Second,
		ErrorLog: log.New(io.Discard, "", 0)}
	scheme := "http"
	if s.TLS {
		if s.Lazy.Name == "" {
			s.Lazy.Name = "chartrepo"
		}
		cfg, err := s.Lazy.ServerConfig("chartrepo", s.RequireClientCert)
		if err != nil {
			return err
		}
		s.srv.TLSConfig = cfg
		ln = tls.NewListener(ln, cfg)
		scheme = "https"
	}
	s.url = scheme + "://" + ln.Addr().String()
	if err := s.Reindex(); err != nil {
		ln.Close()
		return err
	}
	go func() { _ = s.srv.Serve(ln) }()
	return nil
}

// URL is the repository's URL (a HelmRepository's spec.url).
func (s *Server) URL() string { return s.url }

// Stop stops serving.
func (s *Server) Stop() error {
	if s.srv == nil {
		return nil
	}
	return s.srv.Close()
}

// Chart describes a chart to package.
type Chart struct {
	Name, Version string
	// Values are the chart's values.yaml.
	Values map[string]any
	// Files are more files by path in the chart (e.g. "values-prod.yaml").
	Files map[string]string
	// Dependencies are the chart's dependencies (Chart.yaml).
	Dependencies []*chart.Dependency
}

// Package writes c as <name>-<version>.tgz into dir with the Helm library
// and returns its path.
func Package(dir string, c Chart) (string, error) {
	ch := &chart.Chart{
		Metadata: &chart.Metadata{APIVersion: chart.APIVersionV2, Name: c.Name, Version: c.Version,
			AppVersion: c.Version, Description: "A chart for tests", Type: "application", Dependencies: c.Dependencies},
		Values: c.Values,
		Templates: []*chart.File{{Name: "templates/configmap.yaml",
			Data: []byte("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {{ .Release.Name }}\ndata:\n  message: {{ .Values.message | default \"hello\" | quote }}\n")}},
	}
	if c.Values != nil {
		// chartutil.Save writes values.yaml from the raw file.
		b, err := yaml.Marshal(c.Values)
		if err != nil {
			return "", err
		}
		ch.Raw = append(ch.Raw, &chart.File{Name: chartutil.ValuesfileName, Data: b})
	}
	for name, data := range c.Files {
		ch.Files = append(ch.Files, &chart.File{Name: name, Data: []byte(data)})
	}
	if err := ch.Validate(); err != nil {
		return "", fmt.Errorf("chart %s: %w", c.Name, err)
	}
	p, err := chartutil.Save(ch, dir)
	if err != nil {
		return "", fmt.Errorf("package chart %s: %w", c.Name, err)
	}
	return p, nil
}

// Add packages charts into the repository and updates its index.
func (s *Server) Add(charts ...Chart) error {
	for _, c := range charts {
		if _, err := Package(s.Dir, c); err != nil {
			return err
		}
	}
	return s.Reindex()
}

// Reindex rewrites the index from the charts in Dir, as `helm repo index`.
func (s *Server) Reindex() error {
	idx, err := repo.IndexDirectory(s.Dir, s.url)
	if err != nil {
		return fmt.Errorf("index charts: %w", err)
	}
	idx.SortEntries()
	f, err := os.CreateTemp("", "chartrepo-index-")
	if err != nil {
		return err
	}
	defer os.Remove(f.Name())
	f.Close()
	if err := idx.WriteFile(f.Name(), 0o644); err != nil {
		return err
	}
	b, err := os.ReadFile(f.Name())
	if err != nil {
		return err
	}
	s.SetIndex(b)
	return nil
}

// SetIndex serves b as the index from now on, whatever it is (tests of
// bad indexes).
func (s *Server) SetIndex(b []byte) {
	sum := sha256.Sum256(b)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.index = b
	s.etag = `"` + hex.EncodeToString(sum[:16]) + `"`
	// Last-Modified has a resolution of a second: make each index newer.
	now := time.Now().Truncate(time.Second)
	if !now.After(s.modified) {
		now = s.modified.Add(time.Second)
	}
	s.modified = now
}

// Index returns the index served now.
func (s *Server) Index() []byte {
	s.mu.Lock()
	defer s.mu.Unlock()
	return bytes.Clone(s.index)
}

// Counts returns the index requests answered with the index (200) and
// with 304 Not Modified, and the chart downloads, so far.
func (s *Server) Counts() (downloads, notModified, charts int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.downloads, s.notModified, s.chartGets
}

func (s *Server) serve(w http.ResponseWriter, r *http.Request) {
	if s.Username != "" || s.Password != "" {
		u, p, ok := r.BasicAuth()
		if !ok || subtle.ConstantTimeCompare([]byte(u), []byte(s.Username)) != 1 ||
			subtle.ConstantTimeCompare([]byte(p), []byte(s.Password)) != 1 {
			w.Header().Set("WWW-Authenticate", `Basic realm="charts"`)
			http.Error(w, "unauthorized", http.StatusUnauthorized)
			return
		}
	}
	name := path.Base(r.URL.Path)
	if r.URL.Path == "/index.yaml" {
		s.mu.Lock()
		index, etag, modified := s.index, s.etag, s.modified
		s.mu.Unlock()
		w.Header().Set("ETag", etag)
		w.Header().Set("Content-Type", "application/x-yaml")
		rec := &statusRecorder{ResponseWriter: w}
		http.ServeContent(rec, r, "index.yaml", modified, bytes.NewReader(index))
		s.mu.Lock()
		switch rec.status {
		case http.StatusOK, 0:
			s.downloads++
		case http.StatusNotModified:
			s.notModified++
		}
		s.mu.Unlock()
		return
	}
	if filepath.Ext(name) != ".tgz" {
		http.NotFound(w, r)
		return
	}
	s.mu.Lock()
	s.chartGets++
	s.mu.Unlock()
	http.ServeFile(w, r, filepath.Join(s.Dir, name))
}

type statusRecorder struct {
	http.ResponseWriter
	status int
}

func (r *statusRecorder) WriteHeader(code int) {
	r.status = code
	r.ResponseWriter.WriteHeader(code)
}
