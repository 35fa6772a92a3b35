package harness

import (
	"fmt"
	"path/filepath"
	"slices"
	"strconv"

	"github.com/headwater-gitops/headwater/pkg/flagenv"
)

// S3Storage is an S3-compatible bucket (a MinIO server in the tests) that
// the fetcher, the packager and the artifact-server share as their storage
// instead of the directory storage.
type S3Storage struct {
	// Endpoint is the server's host:port, spoken to over plain HTTP.
	Endpoint string
	// Bucket holds the artifacts and the staging area; the services create
	// it if it does not exist.
	Bucket string
	// Prefix, when set, is prepended to every key.
	Prefix string
	// AccessKey and SecretKey are the credentials.
	AccessKey, SecretKey string
}

// String describes the storage for logs; it never shows the secret key.
func (s *S3Storage) String() string {
	return fmt.Sprintf("s3://%s/%s at %s", s.Bucket, s.Prefix, s.Endpoint)
}

// environ is the environment that selects the bucket: the storage flags'
// HEADWATER_* variables, so the credentials stay off the command line (and
// out of the logs). The flags of Config.ExtraArgs still win.
func (s *S3Storage) environ() []string {
	vars := map[string]string{
		"storage-backend":          "s3",
		"storage-s3-endpoint":      s.Endpoint,
		"storage-s3-insecure":      "true",
		"storage-s3-bucket":        s.Bucket,
		"storage-s3-prefix":        s.Prefix,
		"storage-s3-access-key":    s.AccessKey,
		"storage-s3-secret-key":    s.SecretKey,
		"storage-s3-create-bucket": "true",
	}
	env := make([]string, 0, len(vars))
	for flag, v := range vars {
		env = append(env, flagenv.EnvName(flag)+"="+v)
	}
	slices.Sort(env)
	return env
}

// storageServices are the services that read or write the shared storage.
var storageServices = []string{Fetcher, Packager, ArtifactServer}

// extraArtifactServers is the number of artifact-server replicas beyond the
// first.
func (c Config) extraArtifactServers() int {
	return max(c.ArtifactServerReplicas-1, 0)
}

// ArtifactServers returns every artifact-server replica, the first (the one
// listening at ArtifactAddr) first.
func (e *Env) ArtifactServers() []*Service {
	return e.Replicas(ArtifactServer)
}

// addArtifactServerReplicas adds the replicas beyond the first after it,
// each serving the same storage on an address of its own (two ports of
// ports each: file server, telemetry) and advertising ArtifactAddr, as
// replicas behind one Service do. It sets ArtifactServerAddrs.
func (e *Env) addArtifactServerReplicas(ports []int) error {
	e.ArtifactServerAddrs = []string{e.ArtifactAddr}
	addrs, err := e.addReplicas(ArtifactServer, e.Config.extraArtifactServers(), ports,
		[]string{"-storage-addr", "-telemetry-addr"}, "-telemetry-addr")
	for _, a := range addrs {
		e.ArtifactServerAddrs = append(e.ArtifactServerAddrs, a["-storage-addr"])
	}
	return err
}

// addWorkerReplicas adds the fetcher and packager replicas beyond the first
// of each, one port of ports each (telemetry).
func (e *Env) addWorkerReplicas(ports []int) error {
	fetchers := max(e.Config.FetcherReplicas-1, 0)
	if _, err := e.addReplicas(Fetcher, fetchers, ports[:fetchers], []string{"-telemetry-addr"}, "-telemetry-addr"); err != nil {
		return err
	}
	_, err := e.addReplicas(Packager, max(e.Config.PackagerReplicas-1, 0), ports[fetchers:], []string{"-telemetry-addr"}, "-telemetry-addr")
	return err
}

// Replicas returns every process of the service named base (a service
// name), the first first.
func (e *Env) Replicas(base string) []*Service {
	var out []*Service
	for _, s := range e.services {
		if filepath.Base(s.Path) == base {
			out = append(out, s)
		}
	}
	return out
}

// addReplicas inserts n copies of the service named base right after it,
// named base-2, base-3, ..., each with its own log and len(flags) ports of
// ports: the i-th in place of the value of flags[i]. readyFlag names the
// flag whose address serves /readyz; -telemetry-addr must be one of flags.
// It returns each replica's addresses by flag.
func (e *Env) addReplicas(base string, n int, ports []int, flags []string, readyFlag string) ([]map[string]string, error) {
	if n == 0 {
		return nil, nil
	}
	if len(ports) < len(flags)*n {
		return nil, fmt.Errorf("%s replicas: %d ports for %d replicas", base, len(ports), n)
	}
	first := slices.IndexFunc(e.services, func(s *Service) bool { return s.Name == base })
	if first < 0 {
		return nil, fmt.Errorf("%s replicas: no %s", base, base)
	}
	proto := e.services[first]
	var replicas []*Service
	var addrs []map[string]string
	for i := range n {
		name := base + "-" + strconv.Itoa(i+2)
		addr := map[string]string{}
		for j, f := range flags {
			addr[f] = "127.0.0.1:" + strconv.Itoa(ports[len(flags)*i+j])
		}
		args := slices.Clone(proto.Args)
		for j := 0; j+1 < len(args); j++ {
			if v, ok := addr[args[j]]; ok {
				args[j+1] = v
			}
		}
		replicas = append(replicas, &Service{
			Name:          name,
			Path:          proto.Path,
			Args:          args,
			Env:           slices.Clone(proto.Env),
			LogPath:       filepath.Join(e.Config.Dir, "logs", name+".log"),
			ReadyURL:      "http://" + addr[readyFlag] + "/readyz",
			TelemetryAddr: addr["-telemetry-addr"],
		})
		addrs = append(addrs, addr)
	}
	e.services = slices.Insert(e.services, first+1, replicas...)
	return addrs, nil
}

// useS3Storage points the services that use the storage at Config.S3, when
// it is set.
func (e *Env) useS3Storage() {
	if e.Config.S3 == nil {
		return
	}
	env := e.Config.S3.environ()
	for _, s := range e.services {
		if slices.Contains(storageServices, filepath.Base(s.Path)) {
			s.Env = append(slices.Clone(s.Env), env...)
		}
	}
}
