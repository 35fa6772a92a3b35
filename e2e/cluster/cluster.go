// Package cluster runs a real Kubernetes cluster on this machine for the
// tests: etcd, kube-apiserver (ServiceAccount admission on, Node and RBAC
// authorization), kube-controller-manager, kube-scheduler, and one or more
// nodes of kubelet, kube-proxy and containerd with runc, with the pod network
// on a CNI bridge per node, and cluster DNS.
//
// One node (the default) lives with the control plane in a network
// namespace of its own, joined to the machine by one veth pair and routed
// nowhere else: pods reach the API server, each other, and the host end of
// the link (where a test serves its git repositories), and nothing off this
// machine. Several nodes (Options.Nodes) each get a namespace of their own,
// with their own kubelet, kube-proxy and containerd (own root, state and
// socket), and the control plane one more; a bridge on the machine joins them
// all, as a switch joins machines, and each node routes the other nodes' pod
// ranges to them. Images are imported, never pulled.
//
// It needs root, ip(8), iptables, containerd, ctr and runc, and Debian's
// containernetworking-plugins: Available says what is missing. The binaries
// come from hack/build-tools.sh (components kube, kube-node and etcd).
package cluster

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	_ "embed"

	"github.com/headwater-gitops/headwater/testsupport/process"
)

//go:embed manifests/coredns.yaml
var corednsManifest []byte

// Options say where the cluster's binaries and images are.
type Options struct {
	// KubeDir holds kube-apiserver, kubectl and etcd (KUBEBUILDER_ASSETS).
	KubeDir string
	// NodeDir holds kubelet, kube-proxy, kube-scheduler and
	// kube-controller-manager.
	NodeDir string
	// Images are image archives (OCI layout or docker tarballs) imported
	// into containerd before the kubelet starts.
	Images []string
	// Dir is where the node keeps its state (default
	// /var/lib/headwater-cluster); it is emptied first.
	Dir string
	// Log receives the components' output and the harness's progress.
	Log io.Writer
	// Nodes is how many nodes the cluster has (default 1). With more
	// than one, the control plane has a namespace of its own and the
	// nodes are named headwater-node-1, headwater-node-2, ...
	Nodes int
	// AuditPolicy, if set, is kube-apiserver's audit policy (an
	// audit.k8s.io/v1 Policy): it logs what the policy selects, as JSON
	// lines, to Cluster.AuditLogPath. Keep it small: every request the
	// policy selects is written before its response.
	AuditPolicy string
}

// FromEnv returns the Options the Makefile sets up: KUBEBUILDER_ASSETS,
// HEADWATER_KUBE_NODE_DIR and HEADWATER_IMAGES (a colon-separated list).
func FromEnv() Options {
	o := Options{KubeDir: os.Getenv("KUBEBUILDER_ASSETS"), NodeDir: os.Getenv("HEADWATER_KUBE_NODE_DIR")}
	if v := os.Getenv("HEADWATER_IMAGES"); v != "" {
		o.Images = strings.Split(v, ":")
	}
	return o
}

// Available reports what this machine lacks to run a node, or nil.
func (o Options) Available() error {
	var missing []string
	if os.Geteuid() != 0 {
		missing = append(missing, "root (the node makes a network namespace and runs containers)")
	}
	for _, bin := range []string{"ip", "nsenter", "iptables", "containerd", "ctr", "runc", "mount", "sysctl"} {
		if _, err := exec.LookPath(bin); err != nil {
			missing = append(missing, bin+" (Debian: containerd runc iptables iproute2)")
		}
	}
	for _, plugin := range []string{"bridge", "host-local", "loopback", "portmap"} {
		if _, err := os.Stat(filepath.Join("/usr/lib/cni", plugin)); err != nil {
			missing = append(missing, "/usr/lib/cni/"+plugin+" (Debian: containernetworking-plugins)")
		}
	}
	for _, b := range []struct{ dir, name, target string }{
		{o.KubeDir, "kube-apiserver", "kube-tools"}, {o.KubeDir, "kubectl", "kube-tools"}, {o.KubeDir, "etcd", "kube-tools"},
		{o.NodeDir, "kubelet", "kube-node"}, {o.NodeDir, "kube-proxy", "kube-node"},
		{o.NodeDir, "kube-scheduler", "kube-node"}, {o.NodeDir, "kube-controller-manager", "kube-node"},
	} {
		if b.dir == "" {
			missing = append(missing, b.name+" (no directory given: run through `make test-cluster`)")
			continue
		}
		if _, err := os.Stat(filepath.Join(b.dir, b.name)); err != nil {
			missing = append(missing, fmt.Sprintf("%s (`make %s` builds it)", filepath.Join(b.dir, b.name), b.target))
		}
	}
	for _, img := range o.Images {
		if _, err := os.Stat(img); err != nil {
			missing = append(missing, img+" (`make image-archive` builds it)")
		}
	}
	if _, err := os.Stat("/sys/fs/cgroup"); err != nil {
		missing = append(missing, "/sys/fs/cgroup")
	}
	if len(missing) > 0 {
		return fmt.Errorf("this machine cannot run a Kubernetes node: missing %s", strings.Join(missing, "; "))
	}
	return nil
}

// Cluster is a running cluster.
type Cluster struct {
	opts Options
	cp   *netns // the control plane's namespace (the node's, with one node)
	pki  *pki
	dir  string // state on disk
	run  string // sockets and runtime state (short paths)
	// bridge is the machine's bridge that joins the namespaces of a
	// cluster of several nodes ("" with one node).
	bridge string
	// Nodes are the cluster's nodes, in order.
	Nodes []*Node

	// Kubeconfig is the path of an administrator's kubeconfig
	// (system:masters).
	Kubeconfig string
	// Config and Client are the administrator's.
	Config *rest.Config
	Client kubernetes.Interface
	// HostIP is the machine's end of the nodes' links: a server a test
	// listens on there is reachable from every pod.
	HostIP string
	// NodeIP is the first node's address.
	NodeIP string
	// APIServerIP is where the API server listens (port 6443).
	APIServerIP string
	// AuditLogPath is kube-apiserver's audit log (JSON lines, one
	// audit.k8s.io/v1 Event each), with Options.AuditPolicy; "" without.
	AuditLogPath string

	prov   *provisioner
	procs  []*proc
	cancel context.CancelFunc
	done   chan struct{}
}

// TestServerRanges are the private ranges of the servers a test reaches
// through the cluster: the link's (HostIP, where a test's servers listen)
// and the Service range (an in-cluster server behind a Service).
// Headwater's egress policy refuses private addresses to tenants' URLs
// unless allowed: a test's install passes these as its
// -allowed-destinations (HEADWATER_ALLOWED_DESTINATIONS, the chart's
// egress.allowedDestinations).
func (c *Cluster) TestServerRanges() []string {
	ns := c.cp // several nodes: the bridge's range, which the control plane's link is on
	if ns == nil {
		ns = c.Nodes[0].ns
	}
	link := &net.IPNet{IP: net.ParseIP(ns.hostIP).To4(), Mask: net.CIDRMask(ns.prefixLn, 32)}
	link.IP = link.IP.Mask(link.Mask)
	return []string{link.String(), serviceCIDR}
}

// Node is one node of the cluster: its kubelet, kube-proxy and containerd,
// in a network namespace of its own.
type Node struct {
	// Name is the node's name in the API.
	Name string
	// IP is the node's address.
	IP string
	// PodCIDR is the range its pods' addresses come from.
	PodCIDR string

	ns     *netns
	dir    string // state on disk
	run    string // sockets and runtime state
	socket string // containerd's
}

type proc struct {
	name string
	node *Node // nil for the control plane's
	p    *process.Process
}

// Start brings the cluster up: control plane, node Ready, cluster DNS
// Ready. The caller must Stop it.
func Start(ctx context.Context, o Options) (c *Cluster, err error) {
	if err := o.Available(); err != nil {
		return nil, err
	}
	if o.Nodes < 1 {
		o.Nodes = 1
	}
	if o.Log == nil {
		o.Log = io.Discard
	}
	c = layout(o)
	c.prov = &provisioner{dir: filepath.Join(c.dir, "volumes"), limits: map[string]string{}, logf: c.logf}
	// A run that was killed leaves its processes' mounts and its
	// namespace: clear them first.
	c.cleanup()
	defer func() {
		if err != nil {
			c.Stop()
			c = nil
		}
	}()
	dirs := []string{c.dir, c.run}
	for _, n := range c.Nodes {
		dirs = append(dirs, n.dir, n.run)
	}
	for _, d := range dirs {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return c, fmt.Errorf("cluster dir: %w", err)
		}
	}
	if err := c.network(); err != nil {
		return c, err
	}
	if err := c.certificates(); err != nil {
		return c, err
	}
	steps := []struct {
		name string
		fn   func(context.Context) error
	}{
		{"etcd", c.startEtcd},
		{"kube-apiserver", c.startAPIServer},
		{"kube-controller-manager and kube-scheduler", c.startControllers},
		{"containerd", c.eachNode(c.startContainerd)},
		{"kubelet and kube-proxy", c.eachNode(c.startNode)},
		{"cluster DNS", c.startDNS},
	}
	for _, s := range steps {
		start := time.Now()
		if err := s.fn(ctx); err != nil {
			return c, fmt.Errorf("start %s: %w", s.name, err)
		}
		c.logf("cluster: %s up in %s", s.name, time.Since(start).Round(10*time.Millisecond))
	}
	return c, nil
}

// layout names the cluster's namespaces, addresses and directories.
func layout(o Options) *Cluster {
	if o.Nodes == 1 {
		dir := o.Dir
		if dir == "" {
			dir = "/var/lib/headwater-cluster"
		}
		ns := &netns{name: nodeName, hostIf: "hwnode0", hostIP: "10.213.0.1", nodeIP: "10.213.0.2", prefixLn: 30}
		run := "/run/headwater-node"
		n := &Node{Name: nodeName, IP: ns.nodeIP, PodCIDR: podCIDR, ns: ns, dir: dir, run: run, socket: filepath.Join(run, "containerd.sock")}
		return &Cluster{opts: o, cp: ns, dir: dir, run: run, Nodes: []*Node{n},
			HostIP: ns.hostIP, NodeIP: ns.nodeIP, APIServerIP: ns.nodeIP, done: make(chan struct{})}
	}
	dir := o.Dir
	if dir == "" {
		dir = "/var/lib/headwater-cluster-multi"
	}
	const hostIP, cpIP = "10.213.1.1", "10.213.1.2"
	c := &Cluster{opts: o, dir: dir, run: "/run/headwater-multi", bridge: "hwnodes0",
		HostIP: hostIP, APIServerIP: cpIP, done: make(chan struct{})}
	c.cp = &netns{name: "headwater-cp", hostIf: "hwcp0", hostIP: hostIP, nodeIP: cpIP, prefixLn: 24, bridge: c.bridge}
	for i := 1; i <= o.Nodes; i++ {
		name := fmt.Sprintf("%s-%d", nodeName, i)
		ip := fmt.Sprintf("10.213.1.%d", 10+i)
		run := filepath.Join(c.run, fmt.Sprint(i))
		c.Nodes = append(c.Nodes, &Node{
			Name: name, IP: ip, PodCIDR: fmt.Sprintf("10.88.%d.0/24", i),
			ns:  &netns{name: name, hostIf: fmt.Sprintf("hwnode%d", i), hostIP: hostIP, nodeIP: ip, prefixLn: 24, bridge: c.bridge},
			dir: filepath.Join(dir, name), run: run, socket: filepath.Join(run, "containerd.sock"),
		})
	}
	// Every namespace routes each node's pod range to that node.
	for _, n := range c.Nodes {
		c.cp.routes = append(c.cp.routes, [2]string{n.PodCIDR, n.IP})
		for _, m := range c.Nodes {
			if m != n {
				n.ns.routes = append(n.ns.routes, [2]string{m.PodCIDR, m.IP})
			}
		}
	}
	c.NodeIP = c.Nodes[0].IP
	return c
}

// network makes the namespaces: the node's (which the control plane shares)
// with one node; otherwise the bridge, the control plane's and each node's.
func (c *Cluster) network() error {
	if c.bridge != "" {
		for _, args := range [][]string{
			{"link", "add", c.bridge, "type", "bridge"},
			{"addr", "add", c.HostIP + "/24", "dev", c.bridge},
			{"link", "set", c.bridge, "up"},
		} {
			if err := ip(args...); err != nil {
				return err
			}
		}
		if err := c.cp.create(); err != nil {
			return err
		}
	}
	for _, n := range c.Nodes {
		if err := n.ns.create(); err != nil {
			return err
		}
		if c.bridge != "" {
			// Pods keep their addresses towards other pods (the CNI
			// bridge masquerades nothing here) and go out as the node
			// to anything else.
			out, err := n.ns.command("iptables", "-t", "nat", "-A", "POSTROUTING", "-s", n.PodCIDR, "!", "-d", podCIDR, "-j", "MASQUERADE").CombinedOutput()
			if err != nil {
				return fmt.Errorf("masquerade %s: %w: %s", n.Name, err, out)
			}
		}
	}
	return nil
}

// eachNode runs fn for every node, in order.
func (c *Cluster) eachNode(fn func(context.Context, *Node) error) func(context.Context) error {
	return func(ctx context.Context) error {
		for _, n := range c.Nodes {
			if err := fn(ctx, n); err != nil {
				if len(c.Nodes) > 1 {
					return fmt.Errorf("%s: %w", n.Name, err)
				}
				return err
			}
		}
		return nil
	}
}

// Node returns the node named name, or nil.
func (c *Cluster) Node(name string) *Node {
	for _, n := range c.Nodes {
		if n.Name == name {
			return n
		}
	}
	return nil
}

func (c *Cluster) logf(format string, args ...any) {
	fmt.Fprintf(c.opts.Log, format+"\n", args...)
}

func (c *Cluster) certificates() error {
	pkiDir := filepath.Join(c.dir, "pki")
	if err := os.MkdirAll(pkiDir, 0o700); err != nil {
		return fmt.Errorf("pki dir: %w", err)
	}
	p, err := newPKI(pkiDir)
	if err != nil {
		return err
	}
	c.pki = p
	server := "https://" + net.JoinHostPort(c.APIServerIP, "6443")
	issue := []struct {
		name, cn string
		groups   []string
		ips      []net.IP
		dns      []string
	}{
		{name: "apiserver", cn: "kube-apiserver",
			ips: []net.IP{net.ParseIP(c.APIServerIP), net.ParseIP(apiServiceIP), net.ParseIP("127.0.0.1")},
			dns: []string{"kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc." + clusterDomain, "localhost"}},
		{name: "apiserver-kubelet-client", cn: "kube-apiserver-kubelet-client", groups: []string{"system:masters"}},
		{name: "admin", cn: "headwater-test-admin", groups: []string{"system:masters"}},
		{name: "controller-manager", cn: "system:kube-controller-manager"},
		{name: "scheduler", cn: "system:kube-scheduler"},
		{name: "kube-proxy", cn: "system:kube-proxy"},
	}
	kubeconfigs := []string{"admin", "controller-manager", "scheduler", "kube-proxy"}
	for _, n := range c.Nodes {
		issue = append(issue, struct {
			name, cn string
			groups   []string
			ips      []net.IP
			dns      []string
		}{name: n.kubeletCreds(), cn: "system:node:" + n.Name, groups: []string{"system:nodes"}})
		kubeconfigs = append(kubeconfigs, n.kubeletCreds())
	}
	for _, i := range issue {
		if err := p.issue(i.name, i.cn, i.groups, i.ips, i.dns); err != nil {
			return err
		}
	}
	for _, name := range kubeconfigs {
		if _, err := p.kubeconfig(name, server); err != nil {
			return err
		}
	}
	c.Kubeconfig = p.path("admin.kubeconfig")
	cfg, err := clientcmd.BuildConfigFromFlags("", c.Kubeconfig)
	if err != nil {
		return fmt.Errorf("admin kubeconfig: %w", err)
	}
	cfg.QPS, cfg.Burst = 50, 100
	c.Config = cfg
	c.Client, err = kubernetes.NewForConfig(cfg)
	if err != nil {
		return fmt.Errorf("admin client: %w", err)
	}
	c.prov.client = c.Client
	return nil
}

// kubeletCreds names the node's kubelet's certificate and kubeconfig.
func (n *Node) kubeletCreds() string {
	if n.Name == nodeName {
		return "kubelet"
	}
	return "kubelet-" + n.Name
}

// start runs a component of the control plane in its namespace.
func (c *Cluster) start(name, bin string, args ...string) error {
	return c.startOn(nil, name, bin, args...)
}

// startOn runs a component of node n (the control plane's when nil) in
// its namespace.
func (c *Cluster) startOn(n *Node, name, bin string, args ...string) error {
	ns, prefix := c.cp, name
	if n != nil {
		ns = n.ns
		if len(c.Nodes) > 1 {
			prefix = name + "@" + n.Name
		}
	}
	cmd := ns.command(bin, args...)
	p, err := process.Start(prefix, cmd, prefixWriter(c.opts.Log, prefix))
	if err != nil {
		return err
	}
	c.procs = append(c.procs, &proc{name: name, node: n, p: p})
	return nil
}

// wait polls check until it returns nil, the control plane's component
// exits or timeout.
func (c *Cluster) wait(ctx context.Context, name string, timeout time.Duration, check func(context.Context) error) error {
	return c.waitOn(ctx, nil, name, timeout, check)
}

// waitOn polls check until it returns nil, the component of node n exits
// or timeout.
func (c *Cluster) waitOn(ctx context.Context, n *Node, name string, timeout time.Duration, check func(context.Context) error) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var exited <-chan struct{}
	var p *process.Process
	for _, pr := range c.procs {
		if pr.name == name && pr.node == n {
			p, exited = pr.p, pr.p.Exited()
		}
	}
	var last error
	for {
		if last = check(ctx); last == nil {
			return nil
		}
		select {
		case <-exited:
			return fmt.Errorf("%w: %s", p.ExitError(), tail(p.Output(), 2000))
		case <-ctx.Done():
			return fmt.Errorf("%s not ready after %s: %w", name, timeout, last)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func (c *Cluster) startEtcd(ctx context.Context) error {
	data := filepath.Join(c.dir, "etcd")
	if err := c.start("etcd", filepath.Join(c.opts.KubeDir, "etcd"),
		"--data-dir", data,
		"--listen-client-urls", "http://127.0.0.1:2379", "--advertise-client-urls", "http://127.0.0.1:2379",
		"--listen-peer-urls", "http://127.0.0.1:2380", "--initial-advertise-peer-urls", "http://127.0.0.1:2380",
		"--initial-cluster", "default=http://127.0.0.1:2380", "--name", "default",
		"--unsafe-no-fsync", "--log-level", "warn",
	); err != nil {
		return err
	}
	client := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{DialContext: c.cp.DialContext}}
	return c.wait(ctx, "etcd", time.Minute, func(ctx context.Context) error {
		return httpOK(ctx, client, "http://127.0.0.1:2379/health")
	})
}

func (c *Cluster) startAPIServer(ctx context.Context) error {
	p := c.pki.path
	audit, err := c.auditFlags()
	if err != nil {
		return err
	}
	if err := c.start("kube-apiserver", filepath.Join(c.opts.KubeDir, "kube-apiserver"), append(audit,
		"--etcd-servers", "http://127.0.0.1:2379",
		"--bind-address", "0.0.0.0", "--secure-port", "6443", "--advertise-address", c.APIServerIP,
		"--tls-cert-file", p("apiserver.crt"), "--tls-private-key-file", p("apiserver.key"),
		"--client-ca-file", p("ca.crt"),
		"--kubelet-preferred-address-types", "InternalIP",
		"--kubelet-client-certificate", p("apiserver-kubelet-client.crt"), "--kubelet-client-key", p("apiserver-kubelet-client.key"),
		"--service-account-issuer", "https://kubernetes.default.svc."+clusterDomain,
		"--service-account-key-file", p("sa.pub"), "--service-account-signing-key-file", p("sa.key"),
		"--service-cluster-ip-range", serviceCIDR,
		"--authorization-mode", "Node,RBAC",
		"--enable-admission-plugins", "NodeRestriction",
		"--allow-privileged=true",
		"--profiling=false",
		// With several nodes the control plane is no node: it has no
		// kube-proxy, so it reaches a Service's pods directly; and pods
		// of a node that is lost move after 30 seconds, not 5 minutes,
		// so the tests need not wait (docs/operating.md says what
		// users' clusters do).
		fmt.Sprintf("--enable-aggregator-routing=%t", len(c.Nodes) > 1),
		"--default-not-ready-toleration-seconds", map[bool]string{true: "30", false: "300"}[len(c.Nodes) > 1],
		"--default-unreachable-toleration-seconds", map[bool]string{true: "30", false: "300"}[len(c.Nodes) > 1],
	)...); err != nil {
		return err
	}
	hc, err := rest.HTTPClientFor(c.Config)
	if err != nil {
		return fmt.Errorf("admin http client: %w", err)
	}
	return c.wait(ctx, "kube-apiserver", 2*time.Minute, func(ctx context.Context) error {
		return httpOK(ctx, hc, "https://"+net.JoinHostPort(c.APIServerIP, "6443")+"/readyz")
	})
}

// auditFlags writes Options.AuditPolicy beside the cluster's state and
// returns kube-apiserver's flags for it (none without a policy); the log
// of an earlier run is removed first.
func (c *Cluster) auditFlags() ([]string, error) {
	if c.opts.AuditPolicy == "" {
		return nil, nil
	}
	policy := filepath.Join(c.dir, "audit-policy.yaml")
	if err := os.WriteFile(policy, []byte(c.opts.AuditPolicy), 0o600); err != nil {
		return nil, fmt.Errorf("audit policy: %w", err)
	}
	c.AuditLogPath = filepath.Join(c.dir, "kube-apiserver-audit.log")
	if err := os.Remove(c.AuditLogPath); err != nil && !os.IsNotExist(err) {
		return nil, fmt.Errorf("audit log of an earlier run: %w", err)
	}
	return []string{
		"--audit-policy-file", policy,
		"--audit-log-path", c.AuditLogPath,
		"--audit-log-format", "json",
		// Each event written before its request's response: a reader
		// after a request sees it.
		"--audit-log-mode", "blocking",
	}, nil
}

func (c *Cluster) startControllers(ctx context.Context) error {
	p := c.pki.path
	if err := c.start("kube-controller-manager", filepath.Join(c.opts.NodeDir, "kube-controller-manager"),
		"--kubeconfig", p("controller-manager.kubeconfig"),
		"--authentication-kubeconfig", p("controller-manager.kubeconfig"),
		"--authorization-kubeconfig", p("controller-manager.kubeconfig"),
		"--service-account-private-key-file", p("sa.key"),
		"--root-ca-file", p("ca.crt"),
		"--use-service-account-credentials=true",
		"--leader-elect=false",
		"--bind-address", "127.0.0.1",
		"--node-monitor-grace-period", "20s",
	); err != nil {
		return err
	}
	if err := c.start("kube-scheduler", filepath.Join(c.opts.NodeDir, "kube-scheduler"),
		"--kubeconfig", p("scheduler.kubeconfig"),
		"--authentication-kubeconfig", p("scheduler.kubeconfig"),
		"--authorization-kubeconfig", p("scheduler.kubeconfig"),
		"--leader-elect=false",
		"--bind-address", "127.0.0.1",
	); err != nil {
		return err
	}
	// The controller-manager's ServiceAccount token controller makes the
	// default ServiceAccount of every namespace: pods cannot be created
	// before it exists.
	return c.wait(ctx, "kube-controller-manager", 2*time.Minute, func(ctx context.Context) error {
		_, err := c.Client.CoreV1().ServiceAccounts("default").Get(ctx, "default", metav1.GetOptions{})
		return err
	})
}

func (c *Cluster) startContainerd(ctx context.Context, n *Node) error {
	cniDir := filepath.Join(n.dir, "cni", "net.d")
	// One node masquerades its pods' traffic in the CNI bridge; several
	// do it in one rule of their own (network), so pods keep their
	// addresses towards pods of other nodes.
	if _, err := writeFile(cniDir, "10-headwater.conflist", cniConfig(filepath.Join(n.dir, "cni", "ipam"), n.PodCIDR, len(c.Nodes) == 1)); err != nil {
		return err
	}
	cfg, err := writeFile(n.dir, "containerd.toml", containerdConfig(filepath.Join(n.dir, "containerd"), filepath.Join(n.run, "containerd"), n.socket, cniDir))
	if err != nil {
		return err
	}
	if err := c.startOn(n, "containerd", "containerd", "--config", cfg, "--log-level", "warn"); err != nil {
		return err
	}
	if err := c.waitOn(ctx, n, "containerd", time.Minute, func(ctx context.Context) error {
		return n.ctr(ctx, io.Discard, "version")
	}); err != nil {
		return err
	}
	for _, img := range c.opts.Images {
		start := time.Now()
		if err := n.importImage(ctx, img); err != nil {
			return err
		}
		c.logf("cluster: imported %s into %s in %s", img, n.Name, time.Since(start).Round(10*time.Millisecond))
	}
	return nil
}

// ImportImage imports an image archive (an OCI layout or docker tarball)
// into every node's containerd, for the linux/amd64 platform.
func (c *Cluster) ImportImage(ctx context.Context, archive string) error {
	for _, n := range c.Nodes {
		if err := n.importImage(ctx, archive); err != nil {
			return err
		}
	}
	return nil
}

func (n *Node) importImage(ctx context.Context, archive string) error {
	var out bytes.Buffer
	if err := n.ctr(ctx, &out, "-n", "k8s.io", "images", "import", "--platform", "linux/amd64", archive); err != nil {
		return fmt.Errorf("import %s into %s: %w: %s", archive, n.Name, err, tail(out.String(), 2000))
	}
	return nil
}

// Images lists the images the first node has.
func (c *Cluster) Images(ctx context.Context) ([]string, error) {
	var out bytes.Buffer
	if err := c.Nodes[0].ctr(ctx, &out, "-n", "k8s.io", "images", "ls", "-q"); err != nil {
		return nil, fmt.Errorf("list images: %w", err)
	}
	return strings.Fields(out.String()), nil
}

func (n *Node) ctr(ctx context.Context, out io.Writer, args ...string) error {
	cmd := exec.CommandContext(ctx, "ctr", append([]string{"--address", n.socket}, args...)...)
	cmd.Stdout, cmd.Stderr = out, out
	return cmd.Run()
}

func (c *Cluster) startNode(ctx context.Context, n *Node) error {
	p := c.pki.path
	resolv, err := writeFile(n.dir, "resolv.conf", "# pods resolve only cluster names\n")
	if err != nil {
		return err
	}
	kcfg, err := writeFile(n.dir, "kubelet.yaml", kubeletConfig(p("ca.crt"), n.socket, resolv, filepath.Join(n.dir, "pod-logs")))
	if err != nil {
		return err
	}
	if err := c.startOn(n, "kubelet", filepath.Join(c.opts.NodeDir, "kubelet"),
		"--config", kcfg,
		"--kubeconfig", p(n.kubeletCreds()+".kubeconfig"),
		"--root-dir", filepath.Join(n.dir, "kubelet"),
		"--cert-dir", filepath.Join(n.dir, "kubelet-pki"),
		"--node-ip", n.IP,
		"--hostname-override", n.Name,
		"--v", "1",
	); err != nil {
		return err
	}
	pcfg, err := writeFile(n.dir, "kube-proxy.yaml", kubeProxyConfig(p("kube-proxy.kubeconfig"), n.Name))
	if err != nil {
		return err
	}
	if err := c.startOn(n, "kube-proxy", filepath.Join(c.opts.NodeDir, "kube-proxy"), "--config", pcfg); err != nil {
		return err
	}
	return c.waitOn(ctx, n, "kubelet", 3*time.Minute, func(ctx context.Context) error {
		return c.NodeReady(ctx, n.Name)
	})
}

// NodeReady is nil when node name is Ready and untainted, and otherwise
// says why not.
func (c *Cluster) NodeReady(ctx context.Context, name string) error {
	n, err := c.Client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return err
	}
	for _, cond := range n.Status.Conditions {
		if cond.Type == corev1.NodeReady {
			if cond.Status != corev1.ConditionTrue {
				return fmt.Errorf("node %s not Ready: %s", name, cond.Message)
			}
			for _, t := range n.Spec.Taints {
				if t.Effect == corev1.TaintEffectNoSchedule || t.Effect == corev1.TaintEffectNoExecute {
					return fmt.Errorf("node %s still tainted %s", name, t.Key)
				}
			}
			return nil
		}
	}
	return fmt.Errorf("node %s has no Ready condition yet", name)
}

func (c *Cluster) startDNS(ctx context.Context) error {
	pctx, cancel := context.WithCancel(context.Background())
	c.cancel = cancel
	go func() {
		defer close(c.done)
		c.prov.run(pctx)
	}()
	if out, err := c.Kubectl(ctx, "apply", "-f", "-").WithStdin(bytes.NewReader(corednsManifest)).Run(); err != nil {
		return fmt.Errorf("apply coredns: %w: %s", err, out)
	}
	if len(c.Nodes) > 1 {
		// Cluster DNS survives the loss of a node: two replicas, on
		// different nodes.
		patch := `{"spec":{"replicas":2,"template":{"spec":{"topologySpreadConstraints":[{"maxSkew":1,"topologyKey":"kubernetes.io/hostname","whenUnsatisfiable":"DoNotSchedule","labelSelector":{"matchLabels":{"k8s-app":"kube-dns"}}}]}}}}`
		if out, err := c.Kubectl(ctx, "-n", "kube-system", "patch", "deployment/coredns", "-p", patch).Run(); err != nil {
			return fmt.Errorf("spread coredns: %w: %s", err, out)
		}
	}
	return c.WaitRollout(ctx, "kube-system", "deployment/coredns", 3*time.Minute)
}

// WaitRollout waits until kubectl rollout status of what in ns succeeds.
func (c *Cluster) WaitRollout(ctx context.Context, ns, what string, timeout time.Duration) error {
	out, err := c.Kubectl(ctx, "-n", ns, "rollout", "status", what, "--timeout", timeout.String()).Run()
	if err != nil {
		return fmt.Errorf("rollout %s/%s: %w: %s", ns, what, err, out)
	}
	return nil
}

// DialContext dials addr from inside the first node's network namespace,
// as a pod would: pod and Service addresses are reachable through it.
func (c *Cluster) DialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	return c.Nodes[0].ns.DialContext(ctx, network, addr)
}

// DialContext dials addr from inside the node's network namespace.
func (n *Node) DialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	return n.ns.DialContext(ctx, network, addr)
}

// DialContextWith dials addr from inside the node's network namespace with
// d (its Control functions see the socket, as a test that needs its source
// port after a failed connect does).
func (n *Node) DialContextWith(ctx context.Context, d *net.Dialer, network, addr string) (net.Conn, error) {
	return n.ns.dial(ctx, d, network, addr)
}

// HTTPClient is a client whose connections start inside the node's
// network namespace, through its kube-proxy's Service rules.
func (n *Node) HTTPClient() *http.Client { return nodeHTTP(n.ns, nil) }

// Command returns a command that runs name with args in the node's network
// namespace (and in no other namespace of it): what a test reads of the
// node's kernel state, /proc/net/nf_conntrack or its routes.
func (n *Node) Command(name string, args ...string) *exec.Cmd { return n.ns.command(name, args...) }

// LimitVolume makes the volume of every claim named claim provisioned from
// now on a tmpfs of size (as mount(8) takes it: "24m"), so a test can
// fill it; "" lifts the limit.
func (c *Cluster) LimitVolume(claim, size string) {
	c.prov.setLimit(claim, size)
}

// HTTPClient is a client whose connections start inside the first node's
// network namespace, so it reaches pod and Service addresses (and cluster
// names resolved with LookupService) as a pod would.
func (c *Cluster) HTTPClient() *http.Client { return nodeHTTP(c.Nodes[0].ns, nil) }

func nodeHTTP(ns *netns, tlsConfig *tls.Config) *http.Client {
	return &http.Client{
		Timeout: 30 * time.Second,
		Transport: &http.Transport{
			DialContext:     ns.DialContext,
			TLSClientConfig: tlsConfig,
			MaxIdleConns:    10,
		},
	}
}

// ServiceURL is http://<cluster IP>:<port> of the Service's port named
// port (the first if empty): a Service address the test reaches through
// HTTPClient.
func (c *Cluster) ServiceURL(ctx context.Context, ns, name, port string) (string, error) {
	s, err := c.Client.CoreV1().Services(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return "", fmt.Errorf("service %s/%s: %w", ns, name, err)
	}
	for _, p := range s.Spec.Ports {
		if port == "" || p.Name == port {
			return fmt.Sprintf("http://%s", net.JoinHostPort(s.Spec.ClusterIP, fmt.Sprint(p.Port))), nil
		}
	}
	return "", fmt.Errorf("service %s/%s has no port %q", ns, name, port)
}

// PodURL is http://<pod IP>:<port> of pod.
func PodURL(pod *corev1.Pod, port int) string {
	return fmt.Sprintf("http://%s", net.JoinHostPort(pod.Status.PodIP, fmt.Sprint(port)))
}

// Stop stops every component and removes the node's containers, mounts,
// namespace and state. It is safe to call more than once.
func (c *Cluster) Stop() {
	if c.cancel != nil {
		c.cancel()
		<-c.done
		c.cancel = nil
	}
	// The kubelets first, so they restart nothing; then every container,
	// then the rest of the nodes and the control plane.
	order := []string{"kubelet", "kube-proxy", "containerd", "kube-scheduler", "kube-controller-manager", "kube-apiserver", "etcd"}
	for _, name := range order {
		for _, pr := range c.procs {
			if pr.name != name {
				continue
			}
			if name == "containerd" {
				pr.node.removeContainers()
			}
			_ = pr.p.Stop()
		}
	}
	c.procs = nil
	c.cleanup()
}

// StopNode stops node name hard, as a machine that loses its power: its
// link is cut first, so it says goodbye to nobody, then its kubelet,
// kube-proxy, containerd, container shims and every container are killed
// (SIGKILL). The API server learns nothing from it: the node goes NotReady
// when its lease runs out, as a lost machine does. StartNode brings it back
// with the state it had on disk.
func (c *Cluster) StopNode(ctx context.Context, name string) error {
	n := c.Node(name)
	if n == nil {
		return fmt.Errorf("stop node %s: no such node", name)
	}
	// The containers' processes, read before anything dies.
	var out bytes.Buffer
	if err := n.ctr(ctx, &out, "-n", "k8s.io", "tasks", "ls"); err != nil {
		return fmt.Errorf("stop node %s: list containers: %w: %s", name, err, out.String())
	}
	var pids []int
	for _, line := range strings.Split(out.String(), "\n")[1:] {
		var pid int
		if f := strings.Fields(line); len(f) > 1 {
			if _, err := fmt.Sscan(f[1], &pid); err == nil && pid > 0 {
				pids = append(pids, pid)
			}
		}
	}
	if err := n.ns.setLink(false); err != nil {
		return fmt.Errorf("stop node %s: %w", name, err)
	}
	kept := c.procs[:0]
	for _, pr := range c.procs {
		if pr.node == n {
			pr.p.Kill()
			continue
		}
		kept = append(kept, pr)
	}
	c.procs = kept
	killShims(n.socket)
	for _, pid := range pids {
		// Each container's first process: the kernel kills the rest of
		// its PID namespace with it.
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	c.logf("cluster: node %s stopped hard (%d containers killed, link cut)", name, len(pids))
	return nil
}

// StartNode brings back a node StopNode stopped: its link up, then its
// containerd (with the images and state it had), kubelet and kube-proxy;
// it returns once the node is Ready.
func (c *Cluster) StartNode(ctx context.Context, name string) error {
	n := c.Node(name)
	if n == nil {
		return fmt.Errorf("start node %s: no such node", name)
	}
	if err := n.ns.setLink(true); err != nil {
		return fmt.Errorf("start node %s: %w", name, err)
	}
	images := c.opts.Images
	c.opts.Images = nil // still in its content store
	err := c.startContainerd(ctx, n)
	c.opts.Images = images
	if err != nil {
		return fmt.Errorf("start node %s: %w", name, err)
	}
	if err := c.startNode(ctx, n); err != nil {
		return fmt.Errorf("start node %s: %w", name, err)
	}
	return nil
}

// removeContainers kills and deletes every container of the node.
func (n *Node) removeContainers() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var out bytes.Buffer
	if err := n.ctr(ctx, &out, "-n", "k8s.io", "tasks", "ls", "-q"); err == nil {
		for _, id := range strings.Fields(out.String()) {
			_ = n.ctr(ctx, io.Discard, "-n", "k8s.io", "tasks", "kill", "-s", "SIGKILL", id)
		}
		for _, id := range strings.Fields(out.String()) {
			_ = n.ctr(ctx, io.Discard, "-n", "k8s.io", "tasks", "rm", "-f", id)
		}
	}
	out.Reset()
	if err := n.ctr(ctx, &out, "-n", "k8s.io", "containers", "ls", "-q"); err == nil {
		for _, id := range strings.Fields(out.String()) {
			_ = n.ctr(ctx, io.Discard, "-n", "k8s.io", "containers", "rm", id)
		}
	}
}

// cleanup kills what is left of the nodes (container shims of their
// containerd), unmounts everything under the cluster's directories and
// removes them, the namespaces and the bridge.
func (c *Cluster) cleanup() {
	for _, n := range c.Nodes {
		killShims(n.socket)
	}
	unmountUnder(c.dir)
	unmountUnder(c.run)
	removePodNetns()
	for _, n := range c.Nodes {
		n.ns.destroy()
	}
	c.cp.destroy()
	if c.bridge != "" {
		_ = exec.Command("ip", "link", "del", c.bridge).Run()
	}
	_ = os.RemoveAll(c.run)
	_ = os.RemoveAll(c.dir)
}

// killShims kills the containerd shims serving socket, and with them their
// containers.
func killShims(socket string) {
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		cmdline, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil {
			continue
		}
		args := strings.Split(string(cmdline), "\x00")
		if !strings.Contains(args[0], "containerd-shim") {
			continue
		}
		if !bytes.Contains(cmdline, []byte(socket)) {
			continue
		}
		var pid int
		if _, err := fmt.Sscan(e.Name(), &pid); err == nil {
			if p, err := os.FindProcess(pid); err == nil {
				_ = p.Kill()
			}
		}
	}
}

// removePodNetns removes the pod network namespaces the CNI plugins made
// (cni-<id>, which only this node's containerd makes here) and kills what
// still runs in them: the containers of a node that was killed outlive
// their shims.
func removePodNetns() {
	out, err := exec.Command("ip", "netns", "list").Output()
	if err != nil {
		return
	}
	for _, line := range strings.Split(string(out), "\n") {
		fields := strings.Fields(line)
		if len(fields) == 0 || !strings.HasPrefix(fields[0], "cni-") {
			continue
		}
		if pids, err := exec.Command("ip", "netns", "pids", fields[0]).Output(); err == nil {
			for _, pid := range strings.Fields(string(pids)) {
				var n int
				if _, err := fmt.Sscan(pid, &n); err == nil {
					if p, err := os.FindProcess(n); err == nil {
						_ = p.Kill()
					}
				}
			}
		}
		_ = exec.Command("ip", "netns", "del", fields[0]).Run()
	}
}

// unmountUnder lazily unmounts every mount point under dir, deepest
// first.
func unmountUnder(dir string) {
	f, err := os.Open("/proc/self/mounts")
	if err != nil {
		return
	}
	defer f.Close()
	var points []string
	s := bufio.NewScanner(f)
	for s.Scan() {
		fields := strings.Fields(s.Text())
		if len(fields) > 1 && (fields[1] == dir || strings.HasPrefix(fields[1], dir+"/")) {
			points = append(points, fields[1])
		}
	}
	sort.Sort(sort.Reverse(sort.StringSlice(points)))
	for _, p := range points {
		_ = exec.Command("umount", "-l", p).Run()
	}
}

func mountTmpfs(dir, size string) error {
	out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size="+size+",mode=0777", "tmpfs", dir).CombinedOutput()
	if err != nil {
		return fmt.Errorf("mount tmpfs on %s: %w: %s", dir, err, out)
	}
	return nil
}

func httpOK(ctx context.Context, client *http.Client, url string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s: %s", url, resp.Status, strings.TrimSpace(string(body)))
	}
	return nil
}

func tail(s string, n int) string {
	if len(s) > n {
		return "..." + s[len(s)-n:]
	}
	return s
}

// prefixWriter writes each line to w with "[name] " before it.
func prefixWriter(w io.Writer, name string) io.Writer {
	if w == io.Discard {
		return nil
	}
	pr, pw := io.Pipe()
	go func() {
		s := bufio.NewScanner(pr)
		s.Buffer(make([]byte, 64<<10), 1<<20)
		for s.Scan() {
			fmt.Fprintf(w, "[%s] %s\n", name, s.Text())
		}
		_, _ = io.Copy(io.Discard, pr)
	}()
	return pw
}
