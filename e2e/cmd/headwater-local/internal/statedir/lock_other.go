//go:build !unix

package statedir

import "os"

// lock does nothing where flock(2) does not exist.
func lock(*os.File) error { return nil }
