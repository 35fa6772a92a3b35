package helmfetch

import (
	"container/list"
	"net/http"
	"sync"
)

// DefaultValidatorEntries bounds the indexes whose validators a fetcher
// remembers by default.
const DefaultValidatorEntries = 4096

// validator is what a server said about an index it sent: its ETag and
// Last-Modified, and the revision (digest) of the content they stand for.
type validator struct {
	etag, lastModified string
	revision           string
}

// Validators remembers, per index URL and credentials fingerprint, the
// validators of the last index downloaded, so the next fetch asks with
// If-None-Match / If-Modified-Since and an unchanged index costs a 304:
// no download, no parse, no digest. A fingerprint is part of the key so
// that a 304 obtained with one source's credentials never tells another
// source (with other or no credentials) a revision. It holds at most max
// entries, dropping the least recently used. The zero value is not
// usable; a nil *Validators remembers nothing.
type Validators struct {
	mu      sync.Mutex
	max     int
	order   *list.List // of *validatorEntry, most recent first
	entries map[string]*list.Element
}

type validatorEntry struct {
	key string
	v   validator
}

// NewValidators returns a cache of at most maxEntries
// (DefaultValidatorEntries when not positive).
func NewValidators(maxEntries int) *Validators {
	if maxEntries <= 0 {
		maxEntries = DefaultValidatorEntries
	}
	return &Validators{max: maxEntries, order: list.New(), entries: map[string]*list.Element{}}
}

func validatorKey(indexURL, fingerprint string) string { return indexURL + "\x00" + fingerprint }

// get returns the validators remembered for key.
func (c *Validators) get(key string) (validator, bool) {
	if c == nil {
		return validator{}, false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.entries[key]
	if !ok {
		return validator{}, false
	}
	c.order.MoveToFront(e)
	return e.Value.(*validatorEntry).v, true
}

// put remembers the validators of a response whose content has revision;
// a response without validators forgets the key.
func (c *Validators) put(key string, h http.Header, revision string) {
	if c == nil {
		return
	}
	v := validator{etag: h.Get("ETag"), lastModified: h.Get("Last-Modified"), revision: revision}
	c.mu.Lock()
	defer c.mu.Unlock()
	if e, ok := c.entries[key]; ok {
		c.order.Remove(e)
		delete(c.entries, key)
	}
	if v.etag == "" && v.lastModified == "" {
		return
	}
	c.entries[key] = c.order.PushFront(&validatorEntry{key: key, v: v})
	for c.order.Len() > c.max {
		last := c.order.Back()
		c.order.Remove(last)
		delete(c.entries, last.Value.(*validatorEntry).key)
	}
}

// forget drops key (its remembered revision turned out unusable).
func (c *Validators) forget(key string) {
	if c == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if e, ok := c.entries[key]; ok {
		c.order.Remove(e)
		delete(c.entries, key)
	}
}

// Len is the number of indexes remembered.
func (c *Validators) Len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.order.Len()
}

// header returns the conditional request headers for v.
func (v validator) header() http.Header {
	h := http.Header{}
	if v.etag != "" {
		h.Set("If-None-Match", v.etag)
	}
	if v.lastModified != "" {
		h.Set("If-Modified-Since", v.lastModified)
	}
	return h
}
