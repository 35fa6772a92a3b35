package harness

// extraWatchers is the number of watcher replicas beyond the first.
func (c Config) extraWatchers() int {
	return max(c.WatcherReplicas-1, 0)
}

// Watchers returns every watcher replica, the first first.
func (e *Env) Watchers() []*Service {
	return e.Replicas(Watcher)
}

// addWatcherReplicas adds the watcher replicas beyond the first after it,
// named watcher-2, watcher-3, ..., each with a telemetry and a health
// address of its own (two ports of ports each) and its own log; they talk
// to the same API server and bus, as replicas of one Deployment do.
func (e *Env) addWatcherReplicas(ports []int) error {
	if _, err := e.addReplicas(Watcher, e.Config.extraWatchers(), ports,
		[]string{"-telemetry-addr", "-health-addr"}, "-health-addr"); err != nil {
		return err
	}
	for i, s := range e.Watchers() {
		if i < len(e.Config.WatcherArgs) {
			s.Args = append(s.Args, e.Config.WatcherArgs[i]...)
		}
	}
	return nil
}
