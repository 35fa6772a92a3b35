package cluster

import (
	"fmt"
	"os"
	"path/filepath"
)

// The cluster's fixed addresses. The pod and Service ranges are private to
// the nodes' namespaces; their links are the only way in or out. With
// several nodes, node i's pods take 10.88.i.0/24 of podCIDR.
const (
	nodeName      = "headwater-node"
	podCIDR       = "10.88.0.0/16"
	serviceCIDR   = "10.96.0.0/16"
	apiServiceIP  = "10.96.0.1"
	dnsServiceIP  = "10.96.0.10"
	clusterDomain = "cluster.local"
	// PauseImage is the pod sandbox image containerd runs; it is built
	// here, never pulled.
	PauseImage = "registry.k8s.io/pause:3.10"
)

// writeFile writes content to dir/name and returns the path.
func writeFile(dir, name, content string) (string, error) {
	path := filepath.Join(dir, name)
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return "", fmt.Errorf("write %s: %w", path, err)
	}
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		return "", fmt.Errorf("write %s: %w", path, err)
	}
	return path, nil
}

// containerdConfig is containerd 1.6's configuration for the node: its own
// root, state and socket, runc with cgroupfs, the CNI plugins of Debian's
// containernetworking-plugins, and what this machine needs of the CRI
// plugin (restrict_oom_score_adj: the sandbox has no CAP_SYS_RESOURCE).
func containerdConfig(root, state, socket, cniConfDir string) string {
	return fmt.Sprintf(`version = 2
root = %q
state = %q

[grpc]
  address = %q

[plugins."io.containerd.internal.v1.opt"]
  path = %q

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = %q
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = %q
`, root, state, socket, filepath.Join(root, "opt"), PauseImage, cniConfDir)
}

// cniConfig is a node's pod network: one bridge, addresses from subnet,
// pods' traffic to anything else masqueraded behind the node when ipMasq.
func cniConfig(ipamDir, subnet string, ipMasq bool) string {
	return fmt.Sprintf(`{
  "cniVersion": "0.4.0",
  "name": "headwater-test",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "hwbr0",
      "isGateway": true,
      "ipMasq": %t,
      "hairpinMode": true,
      "ipam": {
        "type": "host-local",
        "ranges": [[{"subnet": %q}]],
        "routes": [{"dst": "0.0.0.0/0"}],
        "dataDir": %q
      }
    },
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}
`, ipMasq, subnet, ipamDir)
}

// kubeletConfig is the kubelet's configuration on this machine: cgroupfs
// without per-QoS cgroups or allocatable enforcement (the sandbox's cgroup
// v1 tree allows no more), no swap check, the cluster DNS Service, client
// certificates from the CA, and image garbage collection off so the
// imported images stay.
func kubeletConfig(caFile, socket, resolvConf, podLogs string) string {
	return fmt.Sprintf(`apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: %q}
authorization: {mode: Webhook}
containerRuntimeEndpoint: unix://%s
cgroupDriver: cgroupfs
cgroupsPerQOS: false
enforceNodeAllocatable: []
failSwapOn: false
localStorageCapacityIsolation: false
clusterDNS: [%q]
clusterDomain: %s
resolvConf: %q
podLogsDir: %q
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 10248
serializeImagePulls: false
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard:
  memory.available: 100Mi
  nodefs.available: "1%%"
  imagefs.available: "1%%"
  nodefs.inodesFree: "1%%"
maxPods: 110
`, caFile, socket, dnsServiceIP, clusterDomain, resolvConf, podLogs)
}

// kubeProxyConfig runs kube-proxy's iptables mode with every Service
// connection masqueraded, which keeps pod-to-Service-to-pod traffic on one
// bridge correct without relying on br_netfilter, and without touching the
// machine-wide conntrack settings.
func kubeProxyConfig(kubeconfig, node string) string {
	return fmt.Sprintf(`apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection: {kubeconfig: %q}
hostnameOverride: %s
clusterCIDR: %s
mode: iptables
iptables:
  masqueradeAll: true
  localhostNodePorts: false
conntrack:
  maxPerCore: 0
  min: 0
  tcpEstablishedTimeout: 0s
  tcpCloseWaitTimeout: 0s
metricsBindAddress: 127.0.0.1:10249
healthzBindAddress: 127.0.0.1:10256
`, kubeconfig, node, podCIDR)
}
