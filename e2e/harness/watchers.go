package harness

import (
	"fmt"
	"path/filepath"
	"slices"
	"strconv"
)

// extraWatchers is the number of watcher replicas beyond the first.
func (c Config) extraWatchers() int {
	return max(c.WatcherReplicas-1, 0)
}

// Watchers returns every watcher replica, the first first.
func (e *Env) Watchers() []*Service {
	var out []*Service
	for _, s := range e.services {
		if filepath.Base(s.Path) == Watcher {
			out = append(out, s)
		}
	}
	return out
}

// addWatcherReplicas adds the watcher replicas beyond the first after it,
// named watcher-2, watcher-3, ..., each with a telemetry and a health
// address of its own (two ports of ports each) and its own log; they talk
// to the same API server and bus, as replicas of one Deployment do.
func (e *Env) addWatcherReplicas(ports []int) error {
	n := e.Config.extraWatchers()
	if n == 0 {
		return nil
	}
	if len(ports) < 2*n {
		return fmt.Errorf("watcher replicas: %d ports for %d replicas", len(ports), n)
	}
	first := slices.IndexFunc(e.services, func(s *Service) bool { return s.Name == Watcher })
	if first < 0 {
		return fmt.Errorf("watcher replicas: no %s", Watcher)
	}
	proto := e.services[first]
	var replicas []*Service
	for i := range n {
		name := Watcher + "-" + strconv.Itoa(i+2)
		telemetry := "127.0.0.1:" + strconv.Itoa(ports[2*i])
		health := "127.0.0.1:" + strconv.Itoa(ports[2*i+1])
		args := slices.Clone(proto.Args)
		for j := 0; j+1 < len(args); j++ {
			switch args[j] {
			case "-telemetry-addr":
				args[j+1] = telemetry
			case "-health-addr":
				args[j+1] = health
			}
		}
		replicas = append(replicas, &Service{
			Name:          name,
			Path:          proto.Path,
			Args:          args,
			Env:           slices.Clone(proto.Env),
			LogPath:       filepath.Join(e.Config.Dir, "logs", name+".log"),
			ReadyURL:      "http://" + health + "/readyz",
			TelemetryAddr: telemetry,
		})
	}
	e.services = slices.Insert(e.services, first+1, replicas...)
	return nil
}
