package multinodetest

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"
)

// eventually polls check every half second until it returns nil, failing
// t with the last error after timeout.
func eventually(t *testing.T, timeout time.Duration, what string, check func(ctx context.Context) error) {
	t.Helper()
	if err := pollEvery(context.Background(), timeout, 500*time.Millisecond, check); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

func pollEvery(ctx context.Context, timeout, interval time.Duration, check func(ctx context.Context) error) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var last error
	for {
		if last = check(ctx); last == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("after %s: %w", timeout, last)
		case <-time.After(interval):
		}
	}
}

// kubectl runs kubectl with args and fails t on error.
func kubectl(t *testing.T, args ...string) string {
	t.Helper()
	out, err := env.c.Kubectl(context.Background(), args...).Run()
	if err != nil {
		t.Fatalf("kubectl %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return out
}

func resourceQuantity(s string) resource.Quantity { return resource.MustParse(s) }
