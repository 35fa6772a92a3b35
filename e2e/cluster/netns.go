package cluster

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os/exec"
	"runtime"
	"strings"

	"golang.org/x/sys/unix"
)

// netns is a node's (or the control plane's) network namespace: a veth
// pair joins it to the machine's own namespace, on a /30 of their own (one
// node) or through a bridge every namespace of the cluster is on (several
// nodes), and nothing else. It has no default route, so neither the node nor
// its pods can send a packet off this machine: an image pull, a DNS query or
// a source URL that is not served here fails at once ("network is
// unreachable", or refused on the namespace's own loopback).
type netns struct {
	name     string
	hostIf   string // the veth end in the machine's namespace
	hostIP   string // its address: where the tests' git server listens
	nodeIP   string // the node's address, inside the namespace
	prefixLn int
	// bridge, when set, is the machine's bridge the host end is put on
	// (which holds hostIP) instead of holding hostIP itself.
	bridge string
	// routes are more routes of the namespace: {destination, gateway},
	// the other nodes' pod ranges.
	routes [][2]string
}

// ip runs ip(8) with args.
func ip(args ...string) error {
	out, err := exec.Command("ip", args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("ip %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// create makes the namespace and its link, replacing any left by a run
// that was killed.
func (n *netns) create() error {
	n.destroy()
	steps := [][]string{
		{"netns", "add", n.name},
		{"link", "add", n.hostIf, "type", "veth", "peer", "name", "eth0", "netns", n.name},
	}
	if n.bridge != "" {
		steps = append(steps, []string{"link", "set", n.hostIf, "master", n.bridge})
	} else {
		steps = append(steps, []string{"addr", "add", fmt.Sprintf("%s/%d", n.hostIP, n.prefixLn), "dev", n.hostIf})
	}
	steps = append(steps, [][]string{
		{"link", "set", n.hostIf, "up"},
		{"-n", n.name, "addr", "add", fmt.Sprintf("%s/%d", n.nodeIP, n.prefixLn), "dev", "eth0"},
		{"-n", n.name, "link", "set", "eth0", "up"},
		{"-n", n.name, "link", "set", "lo", "up"},
		// Service addresses need a route for a connection from the node
		// itself (the tests' DialContext) to reach kube-proxy's DNAT;
		// what no rule rewrites loops back and is dropped inside the
		// namespace, never sent out of it.
		{"-n", n.name, "route", "add", serviceCIDR, "dev", "lo", "src", n.nodeIP},
	}...)
	for _, r := range n.routes {
		steps = append(steps, []string{"-n", n.name, "route", "add", r[0], "via", r[1]})
	}
	for _, s := range steps {
		if err := ip(s...); err != nil {
			n.destroy()
			return err
		}
	}
	// Pods' traffic is routed by the node (to the API server, to the
	// tests' servers on the host end of the link, between Services).
	for _, kv := range [][2]string{
		{"net.ipv4.ip_forward", "1"},
		{"net.ipv4.conf.all.route_localnet", "1"},
	} {
		if err := n.sysctl(kv[0], kv[1]); err != nil {
			n.destroy()
			return err
		}
	}
	return nil
}

func (n *netns) sysctl(key, value string) error {
	out, err := n.command("sysctl", "-qw", key+"="+value).CombinedOutput()
	if err != nil {
		return fmt.Errorf("sysctl %s in %s: %w: %s", key, n.name, err, strings.TrimSpace(string(out)))
	}
	return nil
}

// setLink brings the host end of the namespace's link up or down: down
// cuts the namespace off the machine and every other namespace, as a
// pulled cable would.
func (n *netns) setLink(up bool) error {
	state := "down"
	if up {
		state = "up"
	}
	return ip("link", "set", n.hostIf, state)
}

// destroy removes the namespace (and with it both veth ends); errors are
// ignored, as there may be nothing to remove.
func (n *netns) destroy() {
	_ = exec.Command("ip", "link", "del", n.hostIf).Run()
	_ = exec.Command("ip", "netns", "del", n.name).Run()
}

// command returns a command that runs name with args in the namespace.
// It enters the network namespace alone (nsenter), not a mount namespace
// too as `ip netns exec` does: that one remounts /sys, which hides the
// cgroup filesystems from the kubelet.
func (n *netns) command(name string, args ...string) *exec.Cmd {
	return exec.Command("nsenter", append([]string{"--net=/run/netns/" + n.name, "--", name}, args...)...)
}

// DialContext dials addr from inside the namespace: the connection's
// socket is made on a thread that has entered it, and keeps belonging to it
// afterwards. Through it the tests reach what only the node reaches: pod
// and Service addresses.
func (n *netns) DialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	return n.dial(ctx, &net.Dialer{}, network, addr)
}

// dial dials addr from inside the namespace with d.
func (n *netns) dial(ctx context.Context, d *net.Dialer, network, addr string) (net.Conn, error) {
	type result struct {
		conn net.Conn
		err  error
	}
	done := make(chan result, 1)
	go func() {
		runtime.LockOSThread()
		// The thread goes back to the scheduler only once it is back in
		// its own namespace; if it cannot get back it stays locked and
		// dies with the goroutine. (A thread that dies sends its death
		// signal to the children it started, so restoring beats dying.)
		self, err := unix.Open(fmt.Sprintf("/proc/self/task/%d/ns/net", unix.Gettid()), unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			done <- result{err: fmt.Errorf("open own netns: %w", err)}
			return
		}
		defer unix.Close(self)
		fd, err := unix.Open("/run/netns/"+n.name, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			runtime.UnlockOSThread()
			done <- result{err: fmt.Errorf("open netns %s: %w", n.name, err)}
			return
		}
		defer unix.Close(fd)
		if err := unix.Setns(fd, unix.CLONE_NEWNET); err != nil {
			runtime.UnlockOSThread()
			done <- result{err: fmt.Errorf("enter netns %s: %w", n.name, err)}
			return
		}
		c, err := d.DialContext(ctx, network, addr)
		if unix.Setns(self, unix.CLONE_NEWNET) == nil {
			runtime.UnlockOSThread()
		}
		done <- result{c, err}
	}()
	select {
	case r := <-done:
		return r.conn, r.err
	case <-ctx.Done():
		return nil, errors.Join(ctx.Err(), fmt.Errorf("dial %s in %s", addr, n.name))
	}
}
