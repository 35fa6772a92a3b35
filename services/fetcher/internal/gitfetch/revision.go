package gitfetch

import (
	"fmt"
	"strings"
)

// Revision formats a commit the way Flux's source-controller does:
//
//	"main@sha1:<hash>"            for reference "refs/heads/main"
//	"v1.0.0@sha1:<hash>"          for reference "refs/tags/v1.0.0"
//	"sha1:<hash>"                 for no reference (a commit alone)
//	"refs/heads/main@sha1:<hash>" when absolute (spec.ref.name is set)
func Revision(reference, hash string, absolute bool) string {
	if absolute {
		if reference != "" {
			return reference + "@" + digest(hash)
		}
		return digest(hash)
	}
	if short := strings.SplitAfterN(reference, "/", 3); len(short) == 3 {
		return short[2] + "@" + digest(hash)
	}
	return digest(hash)
}

// digest is "<algorithm>:<hash>", with Flux's algorithm guess by length.
func digest(hash string) string {
	if hash == "" {
		return ""
	}
	alg := "<unknown>"
	if len(hash) == 40 {
		alg = "sha1"
	}
	return fmt.Sprintf("%s:%s", alg, hash)
}

// ShortMessage is the first line of a commit message, cut at 50 characters
// with "..." as Flux does for its NewArtifact event.
func ShortMessage(message string) string {
	subject, _, _ := strings.Cut(message, "\n")
	r := []rune(subject)
	if len(r) > 50 {
		return string(r[:50]) + "..."
	}
	return subject
}
