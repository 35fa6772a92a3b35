// Package natsserver runs a real NATS server with JetStream in-process: the
// bus that tests and the local runner of `make run` talk to. It links
// nats-server, so it lives in the testsupport module, which no service
// imports; services only ever dial a server with pkg/bus.
package natsserver

import (
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"strings"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// Options configure an in-process NATS server.
type Options struct {
	// Host and Port to listen on; Port -1 picks a free port.
	Host string
	Port int
	// StoreDir is where JetStream keeps its streams.
	StoreDir string
	// Users, when set, are the only clients the server accepts, each with
	// its permissions (see NewIdentities); without, anyone may connect.
	Users []User
	// MonitorPort, when set, serves NATS's monitoring endpoints (/healthz,
	// /varz, /jsz) on Host; -1 picks a free port.
	MonitorPort int
	// Name is the server's name, "headwater-embedded" when empty; the
	// servers of a cluster need names of their own.
	Name string
	// Cluster, when set, makes the server a member of a JetStream cluster.
	Cluster *Cluster
	// TLS, when set, is the server's TLS configuration: every client must
	// connect with TLS, and present a certificate the configuration's
	// ClientCAs verify when its ClientAuth requires one (mutual TLS).
	TLS *tls.Config
}

// Cluster is a server's part in a NATS cluster.
type Cluster struct {
	// Name is the cluster's name, the same on every member.
	Name string
	// Port is where the server listens for routes from the others.
	Port int
	// Routes are the route URLs of every member (nats://127.0.0.1:<port>),
	// this one included.
	Routes []string
}

// Start starts a NATS server with JetStream in this process: the embedded
// default of `make run`, and the real server tests run against.
// Call Shutdown and WaitForShutdown on the result to stop it.
func Start(o Options) (*server.Server, error) {
	if o.Host == "" {
		o.Host = "127.0.0.1"
	}
	if o.Port == 0 {
		o.Port = server.RANDOM_PORT
	}
	if o.StoreDir == "" {
		return nil, errors.New("embedded nats: StoreDir is required")
	}
	if o.Name == "" {
		o.Name = "headwater-embedded"
	}
	opts := &server.Options{
		ServerName: o.Name,
		Host:       o.Host,
		Port:       o.Port,
		JetStream:  true,
		StoreDir:   o.StoreDir,
		NoSigs:     true,
		NoLog:      true,
		HTTPHost:   o.Host,
		HTTPPort:   o.MonitorPort,
	}
	if len(o.Users) > 0 {
		opts.Nkeys = nkeyUsers(o.Users)
	}
	if o.Cluster != nil {
		opts.Cluster = server.ClusterOpts{Name: o.Cluster.Name, Host: o.Host, Port: o.Cluster.Port}
		opts.Routes = server.RoutesFromStr(strings.Join(o.Cluster.Routes, ","))
	}
	if o.TLS != nil {
		opts.TLS = true
		opts.TLSConfig = o.TLS
		opts.TLSVerify = o.TLS.ClientAuth == tls.RequireAndVerifyClientCert
		opts.TLSTimeout = 5
	}
	ns, err := server.NewServer(opts)
	if err != nil {
		return nil, fmt.Errorf("embedded nats: %w", err)
	}
	ns.Start()
	if !ns.ReadyForConnections(10 * time.Second) {
		ns.Shutdown()
		return nil, errors.New("embedded nats: not ready after 10s")
	}
	return ns, nil
}

// StartCluster starts a JetStream cluster of n servers in this process,
// each with its store under dir, and returns them once each accepts
// clients (JetStream elects its leaders a moment later: a client's first
// stream call may have to be retried). Call Shutdown and WaitForShutdown on
// every server to stop it.
func StartCluster(n int, dir string) ([]*server.Server, error) {
	ports := make([]int, n)
	routes := make([]string, n)
	for i := range ports {
		// A free port now; taken again at once by the server.
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("embedded nats cluster: %w", err)
		}
		ports[i] = l.Addr().(*net.TCPAddr).Port
		_ = l.Close()
		routes[i] = fmt.Sprintf("nats://127.0.0.1:%d", ports[i])
	}
	var servers []*server.Server
	for i := range n {
		ns, err := Start(Options{
			Name:     fmt.Sprintf("headwater-embedded-%d", i),
			StoreDir: filepath.Join(dir, fmt.Sprint(i)),
			Cluster:  &Cluster{Name: "headwater", Port: ports[i], Routes: routes},
		})
		if err != nil {
			for _, s := range servers {
				s.Shutdown()
			}
			return nil, err
		}
		servers = append(servers, ns)
	}
	return servers, nil
}
