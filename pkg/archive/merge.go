package archive

import (
	"archive/tar"
	"cmp"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"path"
	"strings"
)

// ErrNotCanonical is wrapped by Merge's errors about a layer whose entries
// are not in canonical order (or that repeats a name).
var ErrNotCanonical = errors.New("entries not in canonical order")

// ErrPathConflict is wrapped by Merge's errors about a name that would be a
// file in one layer and a directory in another.
var ErrPathConflict = errors.New("path conflict")

// ErrPathNotFound is wrapped by Merge's errors about a layer whose From
// names nothing in its tar stream.
var ErrPathNotFound = errors.New("path not found in archive")

// Layer is one tar stream Merge lays over the ones before it.
type Layer struct {
	// Tar is an uncompressed tar stream with its entries in canonical order,
	// as WriteTar writes them and as a Canonicalize artifact holds them.
	Tar io.Reader
	// From selects what the layer contributes: the entry named From and
	// everything below it; empty selects the whole stream. It must be a
	// clean relative slash-separated path.
	From string
	// To is where the selection goes: From is renamed to To, and
	// From/<rest> to To/<rest>. Empty puts it at the root. Everything the
	// layers before this one have at To or below is replaced. It must be a
	// clean relative slash-separated path.
	To string
}

// LayerError says which layer (an index into Merge's layers) an error of
// Merge came from.
type LayerError struct {
	Layer int
	Err   error
}

// Error describes the error with its layer.
func (e *LayerError) Error() string { return fmt.Sprintf("layer %d: %s", e.Layer, e.Err.Error()) }

// Unwrap returns the layer's error.
func (e *LayerError) Unwrap() error { return e.Err }

// Merge writes to dst an uncompressed tar of the layers laid over one
// another, in canonical order with normalised headers, the same bytes
// WriteTar would write for the tree the layers make:
//
//   - each layer contributes the entries of its Tar at From or below,
//     renamed to To, plus the directories above To (and To itself when From
//     is empty), so the tree is complete;
//   - a layer replaces everything earlier layers have at its To or below;
//   - a directory several layers have is written once; a name that is a file
//     in one layer and a directory in another (a file where a later layer
//     needs a directory above its To) fails with ErrPathConflict.
//
// Merge streams: it holds one header per layer and never a file's content,
// reading all layers side by side like a merge sort. It requires each
// layer's entries to be in canonical order (ErrNotCanonical otherwise), and
// rejects unsafe names (ErrUnsafePath) and a From that names nothing
// (ErrPathNotFound). Only regular files and directories are kept.
//
// Once every entry is written, Merge reads each layer's Tar to its end
// before it finishes the output, so a reader that checks what it read when
// it reaches its end (a digest) fails the merge before the output is a
// complete tar. Errors about a layer are *LayerError; errors writing to dst
// are not.
func Merge(dst io.Writer, layers []Layer) (Stats, error) {
	var st Stats
	// Check every layer's paths before reading anything.
	from := make([]string, len(layers))
	to := make([]string, len(layers))
	for i, l := range layers {
		var err error
		if from[i], err = cleanLayerPath("From", l.From); err != nil {
			return st, &LayerError{Layer: i, Err: err}
		}
		if to[i], err = cleanLayerPath("To", l.To); err != nil {
			return st, &LayerError{Layer: i, Err: err}
		}
	}
	cursors := make([]*cursor, len(layers))
	for i, l := range layers {
		c := newCursor(i, l.Tar, from[i], to[i], to[i+1:])
		if err := c.advance(); err != nil {
			return st, &LayerError{Layer: i, Err: err}
		}
		cursors[i] = c
	}
	tw := tar.NewWriter(dst)
	var tied []*cursor
	for {
		// The heads with the smallest name, in layer order.
		tied = tied[:0]
		for _, c := range cursors {
			if c.head == nil {
				continue
			}
			if len(tied) > 0 {
				switch d := canonicalCompare(c.head.name, tied[0].head.name); {
				case d > 0:
					continue
				case d < 0:
					tied = tied[:0]
				}
			}
			tied = append(tied, c)
		}
		if len(tied) == 0 {
			break
		}
		head := tied[0].head
		for _, c := range tied[1:] {
			if !head.dir || !c.head.dir {
				// The last layer is the one that needs the name for
				// something else.
				return st, &LayerError{Layer: c.layer, Err: fmt.Errorf("%w: %q is both a file and a directory", ErrPathConflict, head.name)}
			}
		}
		if head.dir {
			if err := tw.WriteHeader(header(head.name+"/", tar.TypeDir, 0o755, 0)); err != nil {
				return st, err
			}
		} else {
			if err := tw.WriteHeader(header(head.name, tar.TypeReg, fileMode(fs.FileMode(head.mode)), head.size)); err != nil {
				return st, err
			}
			var readErr error
			body := OnReadError(tied[0].tr, func(err error) { readErr = cmp.Or(readErr, err) })
			n, err := io.Copy(tw, body)
			if readErr != nil {
				return st, &LayerError{Layer: tied[0].layer, Err: fmt.Errorf("read %s: %w", head.name, readErr)}
			}
			if err != nil {
				return st, err
			}
			st.Files++
			st.Bytes += n
		}
		for _, c := range tied {
			if err := c.advance(); err != nil {
				return st, &LayerError{Layer: c.layer, Err: err}
			}
		}
	}
	for _, c := range cursors {
		if _, err := io.Copy(io.Discard, c.src); err != nil {
			return st, &LayerError{Layer: c.layer, Err: fmt.Errorf("read to the end: %w", err)}
		}
	}
	return st, tw.Close()
}

// item is an entry a cursor offers, by its output name.
type item struct {
	name string
	dir  bool
	mode int64
	size int64
}

// cursor walks one layer, offering its next entry that no later layer
// replaces.
type cursor struct {
	layer    int
	src      io.Reader
	tr       *tar.Reader
	from, to string
	// covered are the To paths of the later layers.
	covered []string
	// pending are the directories the layer adds itself, in order.
	pending []string
	// prev is the previous name read from tr, for the order check.
	prev  string
	found bool
	eof   bool
	head  *item
}

// newCursor returns the cursor of layer i, reading src, whose selection
// from is renamed to to, and which the later layers' To paths replace.
func newCursor(i int, src io.Reader, from, to string, covered []string) *cursor {
	c := &cursor{layer: i, src: src, tr: tar.NewReader(src), from: from, to: to, covered: covered}
	if to != "" {
		segs := strings.Split(to, "/")
		for n := 1; n < len(segs); n++ {
			c.pending = append(c.pending, strings.Join(segs[:n], "/"))
		}
		if from == "" {
			c.pending = append(c.pending, to)
		}
	}
	return c
}

// cleanLayerPath checks a Layer's From or To: empty, or a clean relative
// path that stays inside the archive.
func cleanLayerPath(field, p string) (string, error) {
	if p == "" {
		return "", nil
	}
	c, err := SafeName(p)
	if err != nil {
		return "", fmt.Errorf("%s: %w", field, err)
	}
	if c != p {
		return "", fmt.Errorf("%s: %w: %q is not a clean path", field, ErrUnsafePath, p)
	}
	return c, nil
}

// advance moves head to the layer's next entry that no later layer
// replaces, or to nil at the end.
func (c *cursor) advance() error {
	for {
		var it item
		switch {
		case len(c.pending) > 0:
			it = item{name: c.pending[0], dir: true}
			c.pending = c.pending[1:]
		case c.eof:
			c.head = nil
			if c.from != "" && !c.found {
				return fmt.Errorf("%w: %q", ErrPathNotFound, c.from)
			}
			return nil
		default:
			h, err := c.tr.Next()
			if errors.Is(err, io.EOF) {
				c.eof = true
				continue
			}
			if err != nil {
				return fmt.Errorf("read: %w", err)
			}
			if h.Typeflag != tar.TypeDir && h.Typeflag != tar.TypeReg {
				continue
			}
			name, err := SafeName(h.Name)
			if err != nil {
				return err
			}
			if c.prev != "" && canonicalCompare(c.prev, name) >= 0 {
				return fmt.Errorf("%w: %q after %q", ErrNotCanonical, name, c.prev)
			}
			c.prev = name
			rel, ok := below(name, c.from)
			if !ok {
				continue
			}
			c.found = true
			out := joinName(c.to, rel)
			if out == "" {
				if h.Typeflag == tar.TypeDir {
					continue // the root itself
				}
				return fmt.Errorf("%w: file %q cannot be the root of the archive", ErrPathConflict, name)
			}
			it = item{name: out, dir: h.Typeflag == tar.TypeDir, mode: h.Mode}
			if !it.dir {
				it.size = h.Size
			}
		}
		if c.replaced(it.name) {
			continue
		}
		c.head = &it
		return nil
	}
}

// replaced reports whether a later layer replaces name.
func (c *cursor) replaced(name string) bool {
	for _, t := range c.covered {
		if _, ok := below(name, t); ok {
			return true
		}
	}
	return false
}

// below reports whether name is dir or lies below it, and returns its path
// relative to dir ("" for dir itself). Every name lies below the root "".
func below(name, dir string) (string, bool) {
	switch {
	case dir == "":
		return name, true
	case name == dir:
		return "", true
	case strings.HasPrefix(name, dir+"/"):
		return name[len(dir)+1:], true
	}
	return "", false
}

func joinName(dir, rel string) string {
	switch {
	case dir == "":
		return rel
	case rel == "":
		return dir
	}
	return path.Join(dir, rel)
}

// canonicalCompare orders slash-separated names as filepath.WalkDir visits
// them: segment by segment, each compared byte-wise, a directory right
// before what it contains. That is a byte-wise comparison in which '/'
// sorts before every other byte.
func canonicalCompare(a, b string) int {
	for i := 0; i < len(a) && i < len(b); i++ {
		ca, cb := a[i], b[i]
		switch {
		case ca == cb:
			continue
		case ca == '/':
			return -1
		case cb == '/':
			return 1
		case ca < cb:
			return -1
		default:
			return 1
		}
	}
	return cmp.Compare(len(a), len(b))
}

// OnReadError returns a reader of r that hands each error r returns, other
// than io.EOF, to f before passing it on. It tells the errors of one reader
// from those of what reads it (a tar reader, a decompressor, a merge) by
// when they happen, however the reader's errors are wrapped on their way up.
func OnReadError(r io.Reader, f func(error)) io.Reader {
	return &readErrNotifier{r: r, f: f}
}

type readErrNotifier struct {
	r io.Reader
	f func(error)
}

func (n *readErrNotifier) Read(p []byte) (int, error) {
	k, err := n.r.Read(p)
	if err != nil && err != io.EOF {
		n.f(err)
	}
	return k, err
}
