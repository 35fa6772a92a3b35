package bench

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/headwater-gitops/headwater/e2e/promtext"
)

// scrape reads http://<addr>/metrics.
func scrape(ctx context.Context, addr string) (promtext.Samples, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/metrics", nil)
	if err != nil {
		return nil, fmt.Errorf("metrics of %s: %w", addr, err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, fmt.Errorf("metrics of %s: %w", addr, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("metrics of %s: %s", addr, resp.Status)
	}
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("metrics of %s: %w", addr, err)
	}
	return promtext.Parse(string(b))
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
