package harness

import (
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestDefineServicesStorage checks the command lines and environments
// defineServices builds for directory and S3 storage and for extra
// artifact-server replicas, without starting anything.
func TestDefineServicesStorage(t *testing.T) {
	s3 := &S3Storage{Endpoint: "127.0.0.1:9000", Bucket: "artifacts", AccessKey: "access", SecretKey: "secret"}
	tests := []struct {
		name     string
		s3       *S3Storage
		replicas int
		want     []string // service names in start order
	}{
		{name: "dir", want: []string{ArtifactServer, Packager, Fetcher, Watcher}},
		{name: "s3", s3: s3, want: []string{ArtifactServer, Packager, Fetcher, Watcher}},
		{name: "s3, two artifact-servers", s3: s3, replicas: 2,
			want: []string{ArtifactServer, ArtifactServer + "-2", Packager, Fetcher, Watcher}},
		{name: "dir, three artifact-servers", replicas: 3,
			want: []string{ArtifactServer, ArtifactServer + "-2", ArtifactServer + "-3", Packager, Fetcher, Watcher}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			e := &Env{
				Config:      Config{Dir: dir, BinDir: "/bin", S3: tt.s3, ArtifactServerReplicas: tt.replicas},
				NATSURL:     "nats://127.0.0.1:4222",
				Kubeconfig:  filepath.Join(dir, "kubeconfig"),
				StoragePath: filepath.Join(dir, "storage"),
			}
			if err := e.defineServices(); err != nil {
				t.Fatal(err)
			}
			var names []string
			for _, s := range e.Services() {
				names = append(names, s.Name)
			}
			if !slices.Equal(names, tt.want) {
				t.Fatalf("services %v, want %v", names, tt.want)
			}

			servers := e.ArtifactServers()
			if len(servers) != max(tt.replicas, 1) || len(e.ArtifactServerAddrs) != len(servers) {
				t.Fatalf("%d artifact-servers, %d addresses, want %d", len(servers), len(e.ArtifactServerAddrs), max(tt.replicas, 1))
			}
			seen := map[string]bool{}
			for i, s := range servers {
				if s.Path != filepath.Join("/bin", ArtifactServer) {
					t.Errorf("%s runs %s", s.Name, s.Path)
				}
				if got := flagValue(s.Args, "-storage-addr"); got != e.ArtifactServerAddrs[i] {
					t.Errorf("%s listens on %s, want %s", s.Name, got, e.ArtifactServerAddrs[i])
				}
				if got := flagValue(s.Args, "-storage-adv-addr"); got != e.ArtifactAddr {
					t.Errorf("%s advertises %s, want %s", s.Name, got, e.ArtifactAddr)
				}
				for _, a := range []string{flagValue(s.Args, "-storage-addr"), s.TelemetryAddr} {
					if seen[a] {
						t.Errorf("%s reuses address %s", s.Name, a)
					}
					seen[a] = true
				}
				if !strings.Contains(s.ReadyURL, s.TelemetryAddr) || flagValue(s.Args, "-telemetry-addr") != s.TelemetryAddr {
					t.Errorf("%s: ready URL %s, -telemetry-addr %s, telemetry %s", s.Name, s.ReadyURL, flagValue(s.Args, "-telemetry-addr"), s.TelemetryAddr)
				}
			}

			for _, s := range e.Services() {
				env := strings.Join(s.Env, "\n")
				usesStorage := s.Name != Watcher
				wantS3 := tt.s3 != nil && usesStorage
				if got := slices.Contains(s.Env, "HEADWATER_STORAGE_BACKEND=s3"); got != wantS3 {
					t.Errorf("%s: S3 backend in environment %v, want %v", s.Name, got, wantS3)
				}
				if wantS3 {
					for _, kv := range []string{"HEADWATER_STORAGE_S3_ENDPOINT=127.0.0.1:9000", "HEADWATER_STORAGE_S3_BUCKET=artifacts",
						"HEADWATER_STORAGE_S3_INSECURE=true", "HEADWATER_STORAGE_S3_ACCESS_KEY=access", "HEADWATER_STORAGE_S3_SECRET_KEY=secret"} {
						if !slices.Contains(s.Env, kv) {
							t.Errorf("%s: environment lacks %s", s.Name, kv)
						}
					}
				}
				if strings.Contains(strings.Join(s.Args, " "), "secret") {
					t.Errorf("%s: the secret key is on the command line: %v", s.Name, s.Args)
				}
				if !usesStorage && strings.Contains(env, "HEADWATER_STORAGE") {
					t.Errorf("%s gets storage settings", s.Name)
				}
				if usesStorage && flagValue(s.Args, "-storage-path") != e.StoragePath {
					t.Errorf("%s: -storage-path %q, want %q", s.Name, flagValue(s.Args, "-storage-path"), e.StoragePath)
				}
			}
		})
	}
}

// flagValue is the value following flag in args, "" if absent.
func flagValue(args []string, flag string) string {
	if i := slices.Index(args, flag); i >= 0 && i+1 < len(args) {
		return args[i+1]
	}
	return ""
}
