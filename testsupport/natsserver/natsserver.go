// Package natsserver runs a real NATS server with JetStream in-process: the
// bus that tests and the local runner of `make run` talk to. It links
// nats-server, so it lives in the testsupport module, which no service
// imports; services only ever dial a server with pkg/bus.
package natsserver

import (
	"crypto/tls"
	"errors"
	"fmt"
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
	// TLS, when set, is the server's TLS configuration: every client must
	// connect with TLS, and present a certificate the configuration's
	// ClientCAs verify when its ClientAuth requires one (mutual TLS).
	TLS *tls.Config
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
	opts := &server.Options{
		ServerName: "headwater-embedded",
		Host:       o.Host,
		Port:       o.Port,
		JetStream:  true,
		StoreDir:   o.StoreDir,
		NoSigs:     true,
		NoLog:      true,
	}
	if len(o.Users) > 0 {
		opts.Nkeys = nkeyUsers(o.Users)
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
