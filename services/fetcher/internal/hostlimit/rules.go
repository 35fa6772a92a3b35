// Package hostlimit keeps the fetcher polite to the hosts it fetches from:
// every HTTP request a fetch makes (git over HTTP, Helm indexes and charts,
// OCI registries, S3) passes a per-host limiter (Transport) that
//
//   - refuses to send it while the host is held: the host answered 429 or
//     503 with Retry-After, and every fetcher replica waits until then;
//   - takes a slot of the host's token bucket (requests per second and
//     burst, by host pattern: Rules), waiting for it a bounded time
//     (Limiter.MaxWait) without spinning;
//
// and otherwise answers that the host is rate limited (*HeldError), with
// when the next request may go. The state of a host (held until, and the
// bucket as GCRA's theoretical arrival time) is one entry of a NATS
// key-value bucket, updated with compare-and-set, so all replicas share
// one limit (KVStore); MemoryStore keeps it in the process.
package hostlimit

import (
	"fmt"
	"path"
	"strconv"
	"strings"
)

// DefaultRules are the limits of a fetcher without -rate-limits: 20
// requests a second per host, in bursts of up to 40. A clone over HTTP is
// two or three requests, a Helm index or chart one, an OCI pull three or
// four: about seven sources a second per host, far under what public
// hosts allow (GitHub's secondary limits, Docker Hub's pulls) and far over
// what a thousand sources on a 10-minute interval need (under two a
// second).
const DefaultRules = "*=20/40"

// Rule is the limit of the hosts a pattern matches.
type Rule struct {
	// Pattern is a host name (with its port, if it has one), a shell
	// pattern such as "*.github.com", or "*" for every host.
	Pattern string
	// Rate is the requests per second allowed in the long run; zero means
	// no limit (holds still apply).
	Rate float64
	// Burst is the requests allowed at once after an idle spell.
	Burst int
}

// Rules are limits by host pattern; the first rule that matches a host
// applies.
type Rules []Rule

// ParseRules parses a comma-separated list of pattern=rate/burst, e.g.
// "github.com=10/20,*.example.com=5/5,*=50/100". A burst left out is
// the rate rounded up; a rate of 0 sets no limit.
func ParseRules(s string) (Rules, error) {
	var rules Rules
	for item := range strings.SplitSeq(s, ",") {
		item = strings.TrimSpace(item)
		if item == "" {
			continue
		}
		pattern, limit, ok := strings.Cut(item, "=")
		pattern = strings.ToLower(strings.TrimSpace(pattern))
		if !ok || pattern == "" {
			return nil, fmt.Errorf("rate limit %q: want host=rate/burst", item)
		}
		if _, err := path.Match(pattern, ""); err != nil {
			return nil, fmt.Errorf("rate limit %q: bad host pattern: %w", item, err)
		}
		rateText, burstText, hasBurst := strings.Cut(strings.TrimSpace(limit), "/")
		rate, err := strconv.ParseFloat(rateText, 64)
		if err != nil || rate < 0 {
			return nil, fmt.Errorf("rate limit %q: rate must be a non-negative number of requests per second", item)
		}
		burst := int(rate + 0.999999)
		if hasBurst {
			if burst, err = strconv.Atoi(burstText); err != nil || burst < 1 {
				return nil, fmt.Errorf("rate limit %q: burst must be a positive number of requests", item)
			}
		}
		rules = append(rules, Rule{Pattern: pattern, Rate: rate, Burst: max(burst, 1)})
	}
	return rules, nil
}

// For returns the rule for host: the first whose pattern matches it,
// with or without its port; a rule without limit when none does.
func (rs Rules) For(host string) Rule {
	host = strings.ToLower(host)
	name := host
	if i := strings.LastIndex(host, ":"); i >= 0 && !strings.HasSuffix(host, "]") {
		name = host[:i]
	}
	for _, r := range rs {
		if ok, _ := path.Match(r.Pattern, host); ok {
			return r
		}
		if ok, _ := path.Match(r.Pattern, name); ok {
			return r
		}
	}
	return Rule{Pattern: host}
}

// String formats rs as ParseRules reads them.
func (rs Rules) String() string {
	parts := make([]string, len(rs))
	for i, r := range rs {
		parts[i] = fmt.Sprintf("%s=%s/%d", r.Pattern, strconv.FormatFloat(r.Rate, 'f', -1, 64), r.Burst)
	}
	return strings.Join(parts, ",")
}
