// Command probe is what the cluster tests run inside a pod to see the
// cluster as a workload does: it downloads a URL (an artifact, by the URL in
// a source's status) and prints its status, size and sha256 digest, failing
// when the digest is not the one expected.
//
//	probe get URL [sha256:<hex>]
//
// On a cluster of several nodes it also checks the pod network: serve
// answers every request with the name of the node it runs on (NODE_NAME);
// mesh resolves a headless Service's name through the cluster DNS, expects
// want addresses behind it, asks each which node it is on (every one a
// different node), and reads the API server's version through the
// kubernetes Service with the pod's ServiceAccount token.
//
//	probe serve ADDR
//	probe mesh HOST PORT WANT
package main

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"sort"
	"strconv"
	"strings"
	"time"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "probe:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	switch {
	case len(args) == 2 && args[0] == "serve":
		return serve(args[1])
	case len(args) == 4 && args[0] == "mesh":
		want, err := strconv.Atoi(args[3])
		if err != nil {
			return fmt.Errorf("mesh: want: %w", err)
		}
		return mesh(args[1], args[2], want)
	case len(args) < 2 || args[0] != "get":
		return fmt.Errorf("usage: probe get URL [sha256:<hex>] | probe serve ADDR | probe mesh HOST PORT WANT")
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

// serve answers every request with the node's name.
func serve(addr string) error {
	node := os.Getenv("NODE_NAME")
	srv := &http.Server{
		Addr:              addr,
		ReadHeaderTimeout: 10 * time.Second,
		Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			fmt.Fprint(w, node)
		}),
	}
	return srv.ListenAndServe()
}

const serviceAccount = "/var/run/secrets/kubernetes.io/serviceaccount/"

// mesh checks DNS, every pod behind host, and the API server, printing a
// line for each.
func mesh(host, port string, want int) error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	addrs, err := net.DefaultResolver.LookupHost(ctx, host)
	if err != nil {
		return fmt.Errorf("resolve %s: %w", host, err)
	}
	sort.Strings(addrs)
	fmt.Printf("dns %s=%s\n", host, strings.Join(addrs, ","))
	if len(addrs) != want {
		return fmt.Errorf("%s has %d addresses, want %d", host, len(addrs), want)
	}
	client := &http.Client{Timeout: 10 * time.Second}
	nodes := map[string]string{}
	for _, a := range addrs {
		body, err := fetch(ctx, client, "http://"+net.JoinHostPort(a, port)+"/", "")
		if err != nil {
			return err
		}
		if prev, ok := nodes[body]; ok {
			return fmt.Errorf("%s and %s both say they are on node %q", prev, a, body)
		}
		nodes[body] = a
		fmt.Printf("pod %s node=%s\n", a, body)
	}
	ca, err := os.ReadFile(serviceAccount + "ca.crt")
	if err != nil {
		return fmt.Errorf("ca: %w", err)
	}
	token, err := os.ReadFile(serviceAccount + "token")
	if err != nil {
		return fmt.Errorf("token: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(ca) {
		return fmt.Errorf("ca: no certificate")
	}
	api := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}}}
	version, err := fetch(ctx, api, "https://kubernetes.default.svc/version", strings.TrimSpace(string(token)))
	if err != nil {
		return err
	}
	fmt.Printf("apiserver ok %d bytes\n", len(version))
	return nil
}

func fetch(ctx context.Context, client *http.Client, url, token string) (string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return "", fmt.Errorf("get %s: %w", url, err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := client.Do(req)
	if err != nil {
		return "", fmt.Errorf("get %s: %w", url, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return "", fmt.Errorf("read %s: %w", url, err)
	}
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("get %s: %s", url, resp.Status)
	}
	return string(body), nil
}
