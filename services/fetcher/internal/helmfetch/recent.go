package helmfetch

import (
	"context"
	"os"
	"sync"
	"time"
)

// Defaults of Recent.
const (
	DefaultRecentTTL     = time.Minute
	DefaultRecentEntries = 4
)

// Recent makes the sources of one repository that are fetched together
// (created together, or reconciled at once) download its index once per
// fetcher. Requests of an index with the same URL and credentials are made
// one at a time: those that waited ask with the validators the first one
// got, and a 304 answers them. The last few indexes downloaded stay on
// local disk (hard links of the downloads, at most max, for ttl), so that
// a source answered with a 304 whose artifact is not stored yet (its
// content not yet in the content cache either) takes the file instead of
// downloading it again. A nil *Recent shares nothing.
type Recent struct {
	dir string
	ttl time.Duration
	max int
	now func() time.Time

	mu      sync.Mutex
	flights map[string]chan struct{}
	files   map[string]recentFile // by key and revision
}

type recentFile struct {
	path string
	size int64
	at   time.Time
}

// NewRecent keeps at most maxEntries indexes for ttl in a new directory
// under tempDir (the system's when empty). Close removes it.
func NewRecent(tempDir string, ttl time.Duration, maxEntries int) (*Recent, error) {
	dir, err := os.MkdirTemp(tempDir, "helm-index-recent-")
	if err != nil {
		return nil, err
	}
	return &Recent{dir: dir, ttl: ttl, max: maxEntries, now: time.Now,
		flights: map[string]chan struct{}{}, files: map[string]recentFile{}}, nil
}

// Close removes the kept indexes.
func (c *Recent) Close() error {
	if c == nil {
		return nil
	}
	return os.RemoveAll(c.dir)
}

// acquire waits until no other request of key is in flight and makes
// this one the request in flight; release ends it.
func (c *Recent) acquire(ctx context.Context, key string) (release func(), err error) {
	if c == nil {
		return func() {}, nil
	}
	for {
		c.mu.Lock()
		ch, busy := c.flights[key]
		if !busy {
			ch = make(chan struct{})
			c.flights[key] = ch
			c.mu.Unlock()
			return func() {
				c.mu.Lock()
				delete(c.flights, key)
				c.mu.Unlock()
				close(ch)
			}, nil
		}
		c.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// keep remembers the downloaded index file of key and revision.
func (c *Recent) keep(key, revision, file string, size int64) {
	if c == nil || c.max <= 0 || c.ttl <= 0 {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.expire()
	id := key + "\x00" + revision
	if _, ok := c.files[id]; ok {
		return
	}
	f, err := os.CreateTemp(c.dir, "index-")
	if err != nil {
		return
	}
	p := f.Name()
	f.Close()
	os.Remove(p)
	if err := os.Link(file, p); err != nil {
		return
	}
	c.files[id] = recentFile{path: p, size: size, at: c.now()}
	for len(c.files) > c.max {
		var oldest string
		for k, f := range c.files {
			if oldest == "" || f.at.Before(c.files[oldest].at) {
				oldest = k
			}
		}
		os.Remove(c.files[oldest].path)
		delete(c.files, oldest)
	}
}

// take links the kept index of key and revision into a new file in dir
// and returns its path and size; ok is false when none is kept.
func (c *Recent) take(key, revision, dir string) (path string, size int64, ok bool) {
	if c == nil {
		return "", 0, false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.expire()
	f, found := c.files[key+"\x00"+revision]
	if !found {
		return "", 0, false
	}
	tmp, err := os.CreateTemp(dir, "helm-index-")
	if err != nil {
		return "", 0, false
	}
	p := tmp.Name()
	tmp.Close()
	os.Remove(p)
	if err := os.Link(f.path, p); err != nil {
		return "", 0, false
	}
	return p, f.size, true
}

// expire drops the files older than the TTL. c.mu is held.
func (c *Recent) expire() {
	for k, f := range c.files {
		if c.now().Sub(f.at) >= c.ttl {
			os.Remove(f.path)
			delete(c.files, k)
		}
	}
}

// Len is the number of indexes kept.
func (c *Recent) Len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.files)
}
