package helmindex

import (
	"time"

	"github.com/Masterminds/semver/v3"
	"helm.sh/helm/v3/pkg/chart"
)

// ChartVersion is one version of a chart in a repository index: the
// fields of Helm's repo.ChartVersion that an index entry holds, decoded
// from the same JSON names. It is defined here rather than taken from
// helm.sh/helm/v3/pkg/repo because that package links Helm's getters and,
// through them, kubectl and most of client-go into the fetcher: about a
// third of its binary, which every replica would map into memory.
type ChartVersion struct {
	*chart.Metadata
	// URLs are where the chart's archive can be downloaded, absolute or
	// relative to the index.
	URLs []string `json:"urls"`
	// Created is when the entry was added to the index.
	Created time.Time `json:"created,omitempty"`
	// Removed marks an entry the repository withdrew.
	Removed bool `json:"removed,omitempty"`
	// Digest is the archive's SHA-256, in hex.
	Digest string `json:"digest,omitempty"`

	// The fields Helm 2 wrote and Helm 3 ignores, kept so that strict
	// decoding accepts old indexes as Helm does.
	ChecksumDeprecated      string `json:"checksum,omitempty"`
	EngineDeprecated        string `json:"engine,omitempty"`
	TillerVersionDeprecated string `json:"tillerVersion,omitempty"`
	URLDeprecated           string `json:"url,omitempty"`
}

// ChartVersions is a chart's entry in an index: its versions, sortable
// by semantic version as Helm sorts them (unparsable versions first).
type ChartVersions []*ChartVersion

// Len is the number of versions.
func (c ChartVersions) Len() int { return len(c) }

// Swap swaps two versions.
func (c ChartVersions) Swap(i, j int) { c[i], c[j] = c[j], c[i] }

// Less orders by semantic version; a version that does not parse sorts
// before every other.
func (c ChartVersions) Less(a, b int) bool {
	i, err := semver.NewVersion(c[a].Version)
	if err != nil {
		return true
	}
	j, err := semver.NewVersion(c[b].Version)
	if err != nil {
		return false
	}
	return i.LessThan(j)
}
