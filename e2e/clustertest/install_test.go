package clustertest

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	hwevents "github.com/headwater-gitops/headwater/pkg/events"
)

// TestDefaultInstall is the short form `make test` runs: the default
// install (kubectl apply -k deploy/) brings every pod Ready; a
// GitRepository becomes Ready through the in-cluster Services and its
// artifact downloads, with its digest, from a pod by the URL in its status;
// fetchers scaled by replicas all take jobs.
func TestDefaultInstall(t *testing.T) {
	requireCluster(t)
	cl := env.Client(t)
	took := install(t, ".")

	start := time.Now()
	_, head := newRepo(t, "podinfo", map[string]string{"kustomize/deployment.yaml": "kind: Deployment\n", "README.md": "podinfo\n"})
	gitRepository(t, cl, "default", "podinfo", "podinfo", time.Minute)
	gr := readyAt(t, cl, "default", "podinfo", head, 3*time.Minute)
	t.Logf("first artifact %s after the GitRepository was created (%s after kubectl apply -k)",
		time.Since(start).Round(100*time.Millisecond), (took + time.Since(start)).Round(100*time.Millisecond))
	a := gr.Status.Artifact
	if want := "http://source-controller.headwater-system.svc.cluster.local./gitrepository/default/podinfo/"; !strings.HasPrefix(a.URL, want) {
		t.Errorf("artifact URL %s, want it under %s", a.URL, want)
	}
	out := download(t, a.URL, a.Digest)
	t.Logf("downloaded from a pod: %s", strings.TrimSpace(out))

	// Fetchers scale by replicas: one more, and every replica takes jobs.
	replicas := len(pods(t, "fetcher")) + 1
	env.Kubectl(t, "-n", ns, "scale", "deployment/fetcher", fmt.Sprintf("--replicas=%d", replicas))
	if err := env.C.WaitRollout(context.Background(), ns, "deployment/fetcher", 3*time.Minute); err != nil {
		t.Fatal(err)
	}
	fetchers := pods(t, "fetcher")
	if len(fetchers) != replicas {
		t.Fatalf("%d fetcher pods, want %d", len(fetchers), replicas)
	}
	// Sources in waves, each of its own repository (identical fetches
	// combine), until every replica has taken a job.
	for wave := 0; ; wave++ {
		var names []string
		heads := map[string]string{}
		for i := range 6 {
			name := fmt.Sprintf("scale-%d-%d", wave, i)
			_, h := newRepo(t, name, map[string]string{"app.yaml": name + "\n"})
			gitRepository(t, cl, "default", name, name, time.Hour)
			names = append(names, name)
			heads[name] = h
		}
		for _, n := range names {
			readyAt(t, cl, "default", n, heads[n], 3*time.Minute)
		}
		m := fetcherJobs(t)
		idle := 0
		for _, v := range m {
			if v == 0 {
				idle++
			}
		}
		t.Logf("after %d sources: jobs per fetcher %v", 6*(wave+1), m)
		if idle == 0 {
			t.Logf("NATS's view of the fetch queue: %s", fetchConsumer(t))
			break
		}
		if wave == 9 {
			t.Fatalf("%d of %d fetchers took no job after %d sources: %v", idle, replicas, 6*(wave+1), m)
		}
	}
	if !full {
		return
	}
	// make test-cluster goes on with the same install.
	t.Run("LeastPrivilege", testLeastPrivilege)
	t.Run("Integrity", func(t *testing.T) { testIntegrity(t, cl, gr) })
	t.Run("Kinds", func(t *testing.T) { testKinds(t, cl) })
	t.Run("Throughput", func(t *testing.T) { testThroughput(t, cl) })
	t.Run("Faults", func(t *testing.T) { testFaults(t, cl) })
	t.Run("BadInput", func(t *testing.T) { testBadInput(t, cl, gr) })
}

// fetchConsumer is what NATS's monitoring endpoint (/jsz) says of the
// fetchers' shared consumer: deliveries, acknowledgements and the pull
// requests waiting, one or more per fetcher replica.
func fetchConsumer(t *testing.T) string {
	t.Helper()
	nats := pods(t, "nats")[0]
	resp, err := env.C.HTTPClient().Get(fmt.Sprintf("http://%s:8222/jsz?accounts=true&streams=true&consumers=true", nats.Status.PodIP))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var jsz struct {
		Accounts []struct {
			Streams []struct {
				Name      string `json:"name"`
				Consumers []struct {
					Name      string `json:"name"`
					Delivered struct {
						Consumer uint64 `json:"consumer_seq"`
					} `json:"delivered"`
					AckFloor struct {
						Consumer uint64 `json:"consumer_seq"`
					} `json:"ack_floor"`
					NumWaiting int `json:"num_waiting"`
					NumPending int `json:"num_pending"`
				} `json:"consumer_detail"`
			} `json:"stream_detail"`
		} `json:"account_details"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&jsz); err != nil {
		t.Fatal(err)
	}
	for _, a := range jsz.Accounts {
		for _, st := range a.Streams {
			for _, c := range st.Consumers {
				if st.Name == hwevents.FetchStream && c.Name == hwevents.FetcherConsumer {
					return fmt.Sprintf("consumer %s/%s delivered %d, acknowledged %d, pending %d, pull requests waiting %d",
						st.Name, c.Name, c.Delivered.Consumer, c.AckFloor.Consumer, c.NumPending, c.NumWaiting)
				}
			}
		}
	}
	t.Fatalf("NATS reports no consumer %s on %s", hwevents.FetcherConsumer, hwevents.FetchStream)
	return ""
}
