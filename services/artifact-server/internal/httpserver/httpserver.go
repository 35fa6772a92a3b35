// Package httpserver serves the shared artifact storage over HTTP the way
// Flux's source-controller serves its storage directory: GET and HEAD of
// /<key>, with ranges and conditional requests, and nothing else. Internal
// keys (staging, temporary files) and directories are never served, and no
// key can reach outside the storage.
package httpserver

import (
	"errors"
	"io"
	"io/fs"
	"mime"
	"net"
	"net/http"
	"os"
	"path"
	"strconv"
	"strings"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/headwater-gitops/headwater/pkg/storage"
	"github.com/headwater-gitops/headwater/pkg/telemetry"
)

// Handler serves the objects of a storage. Use New to make one.
type Handler struct {
	store storage.Storage
	log   logr.Logger
	m     *metrics
}

// New returns a handler serving store, registering its metrics on reg:
// headwater_http_requests_total{code,method},
// headwater_http_request_duration_seconds{method} and
// headwater_http_response_bytes_total{method}. Every request is logged at
// debug level (V(1)).
func New(store storage.Storage, reg prometheus.Registerer, log logr.Logger) *Handler {
	return &Handler{store: store, log: log, m: newMetrics(reg)}
}

// ServeHTTP answers GET and HEAD of /<key>; see the package comment.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	rec := &recorder{ResponseWriter: w, code: http.StatusOK}
	h.serve(rec, r)
	method := methodLabel(r.Method)
	elapsed := time.Since(start)
	h.m.requests.WithLabelValues(strconv.Itoa(rec.code), method).Inc()
	h.m.duration.WithLabelValues(method).Observe(elapsed.Seconds())
	h.m.bytes.WithLabelValues(method).Add(float64(rec.bytes))
	h.log.V(1).Info("http request", "method", r.Method, "path", r.URL.Path, "code", rec.code,
		"bytes", rec.bytes, "duration", elapsed.String(), "remote", r.RemoteAddr)
}

func (h *Handler) serve(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		http.Error(w, http.StatusText(http.StatusMethodNotAllowed), http.StatusMethodNotAllowed)
		return
	}
	key, ok := Key(r.URL.Path)
	if !ok {
		http.NotFound(w, r)
		return
	}
	if r.Method == http.MethodHead {
		// No body: a description is enough (on S3 a HEAD, where Open is a
		// GET of the whole object).
		info, err := h.store.Stat(r.Context(), key)
		if err != nil {
			h.unservable(w, r, key, err)
			return
		}
		h.serveContent(w, r, key, info, io.NewSectionReader(unread{}, 0, info.Size))
		return
	}
	obj, err := h.store.Open(r.Context(), key)
	if err != nil {
		h.unservable(w, r, key, err)
		return
	}
	defer obj.Close()
	h.serveContent(w, r, key, obj.Info(), obj)
}

// unservable answers a request for key that storage could not open or
// describe: 404 for what is not there to serve, 500 otherwise.
func (h *Handler) unservable(w http.ResponseWriter, r *http.Request, key string, err error) {
	if notFound(err) {
		if !errors.Is(err, storage.ErrNotFound) && !errors.Is(err, storage.ErrInvalidKey) {
			// Something is at the key but cannot be served from it.
			h.log.Info("refusing unservable key", "key", key, "error", err.Error())
		}
		http.NotFound(w, r)
		return
	}
	h.log.Error(err, "opening artifact", "key", key)
	http.Error(w, http.StatusText(http.StatusInternalServerError), http.StatusInternalServerError)
}

// serveContent serves content, the object info describes.
func (h *Handler) serveContent(w http.ResponseWriter, r *http.Request, key string, info storage.Info, content io.ReadSeeker) {
	hdr := w.Header()
	hdr.Set("Content-Type", ContentType(key))
	hdr.Set("X-Content-Type-Options", "nosniff")
	if info.ETag != "" {
		hdr.Set("ETag", info.ETag)
	}
	http.ServeContent(w, r, path.Base(key), info.ModTime, content)
}

// unread is the content of a HEAD request, which http.ServeContent seeks
// (for the size) but never reads.
type unread struct{}

func (unread) ReadAt([]byte, int64) (int, error) {
	return 0, errors.New("the body of a HEAD request is not read")
}

// Key turns a request path into the storage key it may serve: ok is false
// for a path that is not a clean key (traversal, empty or "." segments,
// double slashes, a directory with a trailing slash) and for any key with a
// segment starting with a dot, which covers the internal directories
// (storage.IsInternal, e.g. .staging) and the temporary files of atomic
// writes. r.URL.Path is already percent-decoded, so %2e%2e is "..".
func Key(urlPath string) (string, bool) {
	key, found := strings.CutPrefix(urlPath, "/")
	if !found {
		return "", false
	}
	if _, err := storage.CleanKey(key); err != nil || storage.IsInternal(key) {
		return "", false
	}
	for _, seg := range strings.Split(key, "/") {
		if strings.HasPrefix(seg, ".") {
			return "", false
		}
	}
	return key, true
}

// ContentType is the media type an object is served with:
// application/gzip for artifacts (.tar.gz, .tgz), the type of a known
// extension otherwise, and application/octet-stream as the fallback (the
// content is never sniffed).
func ContentType(key string) string {
	if strings.HasSuffix(key, ".tar.gz") || strings.HasSuffix(key, ".tgz") {
		return "application/gzip"
	}
	if t := mime.TypeByExtension(path.Ext(key)); t != "" {
		return t
	}
	return "application/octet-stream"
}

// notFound reports whether an Open error means there is nothing to serve at
// the key: no object, an invalid key, or a filesystem path problem (a file
// used as a directory, a symlink leaving the storage root). Anything else is
// a storage failure.
func notFound(err error) bool {
	var pathErr *fs.PathError
	return errors.Is(err, storage.ErrNotFound) || errors.Is(err, storage.ErrInvalidKey) ||
		errors.Is(err, fs.ErrNotExist) || errors.As(err, &pathErr)
}

// methodLabel bounds the method label to the methods served.
func methodLabel(m string) string {
	switch m {
	case http.MethodGet, http.MethodHead:
		return m
	}
	return "other"
}

// AdvertisedAddr returns the host[:port] to put into artifact URLs when none
// is configured, derived from the listen address: an empty host becomes
// "localhost" (":9090" -> "localhost:9090"), and an unspecified one (0.0.0.0
// or ::) becomes this machine's hostname, which is the pod name in
// Kubernetes. An address that does not parse is returned unchanged.
func AdvertisedAddr(listen string) string {
	host, port, err := net.SplitHostPort(listen)
	if err != nil {
		return listen
	}
	switch host {
	case "":
		host = "localhost"
	case "0.0.0.0", "::":
		host = "localhost"
		if hn, err := os.Hostname(); err == nil && hn != "" {
			host = hn
		}
	}
	return net.JoinHostPort(host, port)
}

type metrics struct {
	requests *prometheus.CounterVec
	duration *prometheus.HistogramVec
	bytes    *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: telemetry.Namespace, Name: "http_requests_total",
			Help: "Artifact HTTP requests, by status code and method.",
		}, []string{"code", "method"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: telemetry.Namespace, Name: "http_request_duration_seconds",
			Help:    "Time to answer one artifact HTTP request, including the transfer.",
			Buckets: []float64{.001, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60},
		}, []string{"method"}),
		bytes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: telemetry.Namespace, Name: "http_response_bytes_total",
			Help: "Response body bytes sent by the artifact server.",
		}, []string{"method"}),
	}
	reg.MustRegister(m.requests, m.duration, m.bytes)
	return m
}

// recorder remembers the status code and counts the body bytes of a
// response. It keeps io.ReaderFrom, so files are still sent with sendfile.
type recorder struct {
	http.ResponseWriter
	code        int
	wroteHeader bool
	bytes       int64
}

func (r *recorder) WriteHeader(code int) {
	if !r.wroteHeader {
		r.code = code
		r.wroteHeader = true
	}
	r.ResponseWriter.WriteHeader(code)
}

func (r *recorder) Write(p []byte) (int, error) {
	r.wroteHeader = true
	n, err := r.ResponseWriter.Write(p)
	r.bytes += int64(n)
	return n, err
}

func (r *recorder) ReadFrom(src io.Reader) (int64, error) {
	r.wroteHeader = true
	var n int64
	var err error
	if rf, ok := r.ResponseWriter.(io.ReaderFrom); ok {
		n, err = rf.ReadFrom(src)
	} else {
		n, err = io.Copy(r.ResponseWriter, src)
	}
	r.bytes += n
	return n, err
}

// Unwrap lets http.ResponseController reach the underlying writer.
func (r *recorder) Unwrap() http.ResponseWriter { return r.ResponseWriter }
