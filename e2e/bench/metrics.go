package bench

import (
	"context"

	"github.com/headwater-gitops/headwater/e2e/promtext"
)

// scrape reads http://<addr>/metrics.
func scrape(ctx context.Context, addr string) (promtext.Samples, error) {
	return promtext.Scrape(ctx, nil, "http://"+addr+"/metrics")
}

// diff returns after minus before, per key, leaving out keys that did not
// change.
func diff(before, after map[string]float64) map[string]float64 {
	out := map[string]float64{}
	for k, v := range after {
		if d := v - before[k]; d != 0 {
			out[k] = d
		}
	}
	return out
}
