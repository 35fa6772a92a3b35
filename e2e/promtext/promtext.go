// Package promtext reads the Prometheus text exposition format, as the
// tests and benchmarks read the services' and Kubernetes' /metrics.
package promtext

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// Sample is one line of the Prometheus text exposition format.
type Sample struct {
	// Name is the metric's name.
	Name string
	// Labels are its labels, unescaped.
	Labels map[string]string
	// Value is its value.
	Value float64
}

// Samples are everything one /metrics page exposed.
type Samples []Sample

// Parse parses the text exposition format, skipping comments; a line it
// cannot read is an error.
func Parse(text string) (Samples, error) {
	var out Samples
	for line := range strings.Lines(text) {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		s, err := parseSample(line)
		if err != nil {
			return nil, err
		}
		out = append(out, s)
	}
	return out, nil
}

// parseSample parses `name{k="v",...} value [timestamp]`.
func parseSample(line string) (Sample, error) {
	s := Sample{Labels: map[string]string{}}
	i := strings.IndexAny(line, "{ ")
	if i <= 0 {
		return s, fmt.Errorf("metric line %q: no value", line)
	}
	s.Name, line = line[:i], line[i:]
	if line[0] == '{' {
		line = line[1:]
		for {
			line = strings.TrimLeft(line, " ,")
			if strings.HasPrefix(line, "}") {
				line = line[1:]
				break
			}
			eq := strings.Index(line, `="`)
			if eq <= 0 {
				return s, fmt.Errorf("metric %s: bad labels", s.Name)
			}
			key := line[:eq]
			line = line[eq+2:]
			var val strings.Builder
			closed := false
			for j := 0; j < len(line); j++ {
				c := line[j]
				if c == '\\' && j+1 < len(line) {
					j++
					switch line[j] {
					case 'n':
						val.WriteByte('\n')
					default:
						val.WriteByte(line[j])
					}
					continue
				}
				if c == '"' {
					line, closed = line[j+1:], true
					break
				}
				val.WriteByte(c)
			}
			if !closed {
				return s, fmt.Errorf("metric %s: unterminated label %s", s.Name, key)
			}
			s.Labels[key] = val.String()
		}
	}
	f := strings.Fields(line)
	if len(f) == 0 {
		return s, fmt.Errorf("metric %s: no value", s.Name)
	}
	v, err := strconv.ParseFloat(f[0], 64)
	if err != nil {
		return s, fmt.Errorf("metric %s: %w", s.Name, err)
	}
	s.Value = v
	return s, nil
}

// SumBy adds up the values of the samples called name, grouped by the
// values of labels joined with "/" (no labels: everything in one group, "").
func (ss Samples) SumBy(name string, labels ...string) map[string]float64 {
	out := map[string]float64{}
	for _, s := range ss {
		if s.Name != name {
			continue
		}
		key := make([]string, len(labels))
		for i, l := range labels {
			key[i] = s.Labels[l]
		}
		out[strings.Join(key, "/")] += s.Value
	}
	return out
}

// Sum adds up the values of the samples called name whose labels include
// every one of match, each a label as the text format writes it
// (`key="value"`), compared whole: `kind="Git"` matches no sample of kind
// GitRepository. A match that does not parse is an error.
func (ss Samples) Sum(name string, match ...string) (float64, error) {
	want, err := parseSample(name + "{" + strings.Join(match, ",") + "} 0")
	if err != nil {
		return 0, fmt.Errorf("match %q: %w", match, err)
	}
	sum := 0.0
	for _, s := range ss {
		if s.Name != name {
			continue
		}
		all := true
		for k, v := range want.Labels {
			if got, ok := s.Labels[k]; !ok || got != v {
				all = false
				break
			}
		}
		if all {
			sum += s.Value
		}
	}
	return sum, nil
}

// Scrape reads and parses the /metrics page at url with hc (nil:
// http.DefaultClient), giving up after 10 s.
func Scrape(ctx context.Context, hc *http.Client, url string) (Samples, error) {
	if hc == nil {
		hc = http.DefaultClient
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, fmt.Errorf("metrics at %s: %w", url, err)
	}
	resp, err := hc.Do(req)
	if err != nil {
		return nil, fmt.Errorf("metrics at %s: %w", url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("metrics at %s: %w", url, err)
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("metrics at %s: %s: %s", url, resp.Status, b)
	}
	ss, err := Parse(string(b))
	if err != nil {
		return nil, fmt.Errorf("metrics at %s: %w", url, err)
	}
	return ss, nil
}
