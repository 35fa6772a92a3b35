// Command probe is what the cluster tests run inside a pod to see the
// cluster as a workload does: it downloads a URL (an artifact, by the URL in
// a source's status) and prints its status, size and sha256 digest, failing
// when the digest is not the one expected.
//
//	probe get URL [sha256:<hex>]
package main

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"os"
	"time"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "probe:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	if len(args) < 2 || args[0] != "get" {
		return fmt.Errorf("usage: probe get URL [sha256:<hex>]")
	}
	client := &http.Client{Timeout: time.Minute}
	resp, err := client.Get(args[1])
	if err != nil {
		return fmt.Errorf("get: %w", err)
	}
	defer resp.Body.Close()
	h := sha256.New()
	n, err := io.Copy(h, resp.Body)
	if err != nil {
		return fmt.Errorf("read %s: %w", args[1], err)
	}
	digest := "sha256:" + hex.EncodeToString(h.Sum(nil))
	fmt.Printf("status=%d size=%d digest=%s\n", resp.StatusCode, n, digest)
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("get %s: %s", args[1], resp.Status)
	}
	if len(args) > 2 && args[2] != digest {
		return fmt.Errorf("digest %s, want %s", digest, args[2])
	}
	return nil
}
