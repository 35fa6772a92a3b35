package deployvalidate

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"flag"
	"io/fs"
	"math/big"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nkeys"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/yaml"
)

// namespace is where deploy/ installs Headwater.
const namespace = "headwater-system"

// s3Secret is the Secret the S3 overlay reads; the user creates it.
const s3Secret = "headwater-s3"

// natsIdentities are the bus identities whose public keys the NATS
// configuration reads from <IDENTITY>_NKEY (see e2e/cmd/headwater-nats).
var natsIdentities = []string{"WATCHER", "FETCHER", "PACKAGER", "ARTIFACT_SERVER", "RECEIVER", "DISPATCHER", "SUBSCRIBER"}

// setNATSUserKeys puts a fresh public key for every identity in the
// environment, as the Secret headwater-nats-users (or compose's users.env)
// does for the NATS server.
func setNATSUserKeys(t *testing.T) {
	t.Helper()
	for _, id := range natsIdentities {
		kp, err := nkeys.CreateUser()
		if err != nil {
			t.Fatal(err)
		}
		pub, _ := kp.PublicKey()
		t.Setenv(id+"_NKEY", pub)
	}
}

// natsSecrets are the Secrets `headwater-nats keys` creates at install
// (e2e/cmd/headwater-nats): the users' public keys for the NATS server, and
// each service's own key (the HTTPSource plug-in fetcher's with
// -plugin-kinds HTTPSource, as the httpsource component's setup Job does).
var natsSecrets = []string{"headwater-nats-users", "headwater-nats-watcher", "headwater-nats-fetcher",
	"headwater-nats-packager", "headwater-nats-artifact-server", "headwater-nats-receiver", "headwater-nats-dispatcher",
	"headwater-nats-plugin-httpsource"}

// natsTLSSecret and natsClientTLSSecret are the certificates
// components/nats-tls reads: the server's and the services'; the user
// creates them (cert-manager, or by hand).
const (
	natsTLSSecret       = "headwater-nats-tls"
	natsClientTLSSecret = "headwater-nats-client-tls"
)

// natsExternalSecret is the Secret of components/nats-external holding the
// URL of the user's NATS; the user creates it.
const natsExternalSecret = "headwater-nats-external"

// storageServices are the services that read or write the artifact storage.
var storageServices = []string{"fetcher", "packager", "artifact-server"}

// build renders a kustomization under deploy/ and runs the checks every
// rendering must pass.
func build(t *testing.T, dir string) (*Manifests, map[string]FlagSet) {
	t.Helper()
	return buildAt(t, filepath.Join(repoRoot(t), dir))
}

// buildWith renders deploy/base with components (directories under
// deploy/components) added, as a user's kustomization beside deploy/base
// would, and runs the checks every rendering must pass. Kustomize takes
// no absolute paths: the kustomization and a copy of deploy/ live in
// memory.
func buildWith(t *testing.T, components ...string) (*Manifests, map[string]FlagSet) {
	t.Helper()
	fsys := memDeploy(t)
	k := "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n  - ../deploy/base\ncomponents:\n"
	for _, c := range components {
		k += "  - ../deploy/components/" + c + "\n"
	}
	if err := fsys.WriteFile("/user/kustomization.yaml", []byte(k)); err != nil {
		t.Fatal(err)
	}
	m, err := BuildFS(fsys, "/user")
	if err != nil {
		t.Fatal(err)
	}
	return checkManifests(t, m)
}

// memDeploy copies deploy/ into an in-memory file system, as /deploy, for
// a kustomization of a test's own beside it (kustomize takes no absolute
// paths).
func memDeploy(t *testing.T) filesys.FileSystem {
	t.Helper()
	root := repoRoot(t)
	fsys := filesys.MakeFsInMemory()
	err := filepath.WalkDir(filepath.Join(root, "deploy"), func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(root, p)
		if err != nil {
			return err
		}
		return fsys.WriteFile("/"+filepath.ToSlash(rel), b)
	})
	if err != nil {
		t.Fatal(err)
	}
	return fsys
}

func buildAt(t *testing.T, dir string) (*Manifests, map[string]FlagSet) {
	t.Helper()
	m, err := Build(dir)
	if err != nil {
		t.Fatal(err)
	}
	return checkManifests(t, m)
}

// checkManifests runs the checks every rendering must pass.
func checkManifests(t *testing.T, m *Manifests) (*Manifests, map[string]FlagSet) {
	t.Helper()
	return checkManifestsIn(t, m, namespace, true)
}

// checkManifestsIn runs the checks every rendering must pass, for one
// installed into ns, which it creates or (a drop-in into Flux's
// namespace) must not.
func checkManifestsIn(t *testing.T, m *Manifests, ns string, createsNamespace bool) (*Manifests, map[string]FlagSet) {
	t.Helper()
	flags, err := AllServiceFlags(repoRoot(t))
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range m.Workloads() {
		for _, p := range CheckWorkload(w, flags) {
			t.Error(p)
		}
	}
	for _, p := range CheckReferences(m, ns, createsNamespace, append([]string{s3Secret, natsTLSSecret, natsClientTLSSecret, natsExternalSecret}, natsSecrets...)) {
		t.Error(p)
	}
	for _, p := range CheckNetworkPolicies(m) {
		t.Error(p)
	}
	return m, flags
}

// container returns the container named after the Deployment.
func container(t *testing.T, m *Manifests, name string) (corev1.Container, corev1.PodSpec) {
	t.Helper()
	d, ok := m.Deployment(name)
	if !ok {
		t.Fatalf("no Deployment %s", name)
	}
	for _, c := range d.Spec.Template.Spec.Containers {
		if c.Name == name {
			return c, d.Spec.Template.Spec
		}
	}
	t.Fatalf("Deployment %s has no container %s", name, name)
	return corev1.Container{}, corev1.PodSpec{}
}

// TestDeployDefault checks deploy/ (`kubectl apply -k deploy/`): the
// CRDs, deploy/base and the in-cluster MinIO, every pod able to start with
// nothing but what the setup Job makes.
func TestDeployDefault(t *testing.T) {
	m, _ := build(t, "deploy")
	root := repoRoot(t)

	want := map[string][]string{
		"Namespace":           {namespace},
		"ServiceAccount":      {"watcher", "fetcher", "packager", "artifact-server", "nats", "setup", "minio"},
		"ClusterRole":         {"headwater-watcher", "headwater-fetcher"},
		"ClusterRoleBinding":  {"headwater-watcher", "headwater-fetcher"},
		"Role":                {"headwater-watcher-leader-election", "headwater-setup"},
		"RoleBinding":         {"headwater-watcher-leader-election", "headwater-setup"},
		"Deployment":          Services,
		"StatefulSet":         {"nats", "minio"},
		"Job":                 {"headwater-setup"},
		"Service":             {"nats", "source-controller", "minio"},
		"PodDisruptionBudget": {"watcher", "artifact-server"},
	}
	for kind, names := range want {
		for _, n := range names {
			if !m.Has(kind, n) {
				t.Errorf("no %s %s (have %v)", kind, n, m.Names(kind))
			}
		}
	}

	// Every generated CRD is installed.
	files, err := filepath.Glob(filepath.Join(root, "deploy", "crds", "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no CRDs in deploy/crds: %v", err)
	}
	for _, f := range files {
		if filepath.Base(f) == "kustomization.yaml" {
			continue
		}
		var crd CRD
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if err := yaml.Unmarshal(b, &crd); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		if !m.Has("CustomResourceDefinition", crd.Name) {
			t.Errorf("CRD %s (%s) is not in deploy/kustomization.yaml", crd.Name, filepath.Base(f))
		}
	}

	for _, s := range Services {
		d, _ := m.Deployment(s)
		if d.Spec.Replicas == nil || *d.Spec.Replicas != 2 {
			t.Errorf("Deployment %s: replicas %v, want 2", s, d.Spec.Replicas)
		}
		c, _ := container(t, m, s)
		e, ok := EnvVar(c, "POD_NAMESPACE")
		if !ok || e.ValueFrom == nil || e.ValueFrom.FieldRef == nil || e.ValueFrom.FieldRef.FieldPath != "metadata.namespace" {
			t.Errorf("%s: POD_NAMESPACE does not come from the downward API (metadata.namespace)", s)
		}
		if u, ok := FlagValue(c, "nats-url"); !ok {
			t.Errorf("%s: -nats-url is not set", s)
		} else {
			checkNATSURL(t, m, s, u)
		}
	}

	// Watcher: leader election on, its Lease in the pod's namespace.
	watcher, _ := container(t, m, "watcher")
	if v, ok := FlagValue(watcher, "leader-elect"); ok && v != "true" {
		t.Errorf("watcher: -leader-elect=%s, want true with 2 replicas", v)
	}
	if v, ok := FlagValue(watcher, "leader-election-namespace"); ok && Expand(v, watcher.Env, namespace) != namespace {
		t.Errorf("watcher: -leader-election-namespace %q is not the pod's namespace", v)
	}
	checkWatcherRBAC(t, m)
	checkFetcherRBAC(t, m)

	// Fetcher: /tmp is a writable emptyDir, HOME and TMPDIR point at it.
	fetcher, fetcherPod := container(t, m, "fetcher")
	if !mountsEmptyDir(fetcher, fetcherPod, "/tmp") {
		t.Errorf("fetcher: /tmp is not an emptyDir")
	}
	for _, n := range []string{"HOME", "TMPDIR"} {
		if v, _ := EnvValue(fetcher, n); v != "/tmp" {
			t.Errorf("fetcher: %s=%q, want /tmp", n, v)
		}
	}

	if _, ok := EnvVar(watcher, EnvName("storage-backend")); ok {
		t.Errorf("watcher: sets storage flags it does not have")
	}
	if len(m.PVCs) != 0 {
		t.Errorf("deploy/ has PVCs %v: the artifacts live in MinIO", m.Names("PersistentVolumeClaim"))
	}
	checkS3Storage(t, m)
	checkMinIO(t, m)
	checkSetup(t, m, true)
	checkSelfSufficient(t, m)
	checkWatcherPDB(t, m)
	checkArtifactService(t, m)
	checkNATS(t, m)
}

// checkNATSURL checks that a service's NATS URL names the nats Service and
// one of its ports.
func checkNATSURL(t *testing.T, m *Manifests, service, raw string) {
	t.Helper()
	u, err := url.Parse(raw)
	if err != nil || u.Scheme != "nats" {
		t.Errorf("%s: -nats-url %q is not a nats:// URL", service, raw)
		return
	}
	host, port, err := net.SplitHostPort(u.Host)
	if err != nil {
		t.Errorf("%s: -nats-url %q: %v", service, raw, err)
		return
	}
	name, _, _ := strings.Cut(host, ".")
	svc, ok := m.Service(name)
	if !ok {
		t.Errorf("%s: -nats-url %q names no Service", service, raw)
		return
	}
	for _, p := range svc.Spec.Ports {
		if port == itoa(p.Port) {
			return
		}
	}
	t.Errorf("%s: -nats-url %q: Service %s has no port %s", service, raw, name, port)
}

func checkWatcherRBAC(t *testing.T, m *Manifests) {
	t.Helper()
	role, ok := m.ClusterRole("headwater-watcher")
	if !ok {
		t.Fatal("no ClusterRole headwater-watcher")
	}
	const group = "source.toolkit.fluxcd.io"
	for _, kind := range []string{"gitrepositories", "helmrepositories", "helmcharts", "buckets", "ocirepositories"} {
		for _, verb := range []string{"get", "list", "watch", "patch", "update"} {
			if !Allows(role.Rules, group, kind, verb) {
				t.Errorf("watcher cannot %s %s", verb, kind)
			}
		}
		for _, sub := range []string{"status", "finalizers"} {
			for _, verb := range []string{"patch", "update"} {
				if !Allows(role.Rules, group, kind+"/"+sub, verb) {
					t.Errorf("watcher cannot %s %s/%s", verb, kind, sub)
				}
			}
		}
	}
	for _, g := range []string{"", "events.k8s.io"} {
		for _, verb := range []string{"create", "patch"} {
			if !Allows(role.Rules, g, "events", verb) {
				t.Errorf("watcher cannot %s events in group %q", verb, g)
			}
		}
	}
	if Allows(role.Rules, "", "secrets", "get") {
		t.Errorf("watcher can read Secrets; only the fetcher needs them")
	}
	le, ok := m.Role("headwater-watcher-leader-election")
	if !ok {
		t.Fatal("no Role headwater-watcher-leader-election")
	}
	for _, verb := range []string{"get", "create", "update"} {
		if !Allows(le.Rules, "coordination.k8s.io", "leases", verb) {
			t.Errorf("watcher cannot %s leases", verb)
		}
	}
	bound := false
	for _, b := range m.RoleBindings {
		if b.RoleRef.Name == le.Name && slices.ContainsFunc(b.Subjects, func(s rbacv1.Subject) bool { return s.Name == "watcher" }) {
			bound = true
		}
	}
	if !bound {
		t.Errorf("Role %s is not bound to the watcher", le.Name)
	}
}

func checkFetcherRBAC(t *testing.T, m *Manifests) {
	t.Helper()
	role, ok := m.ClusterRole("headwater-fetcher")
	if !ok {
		t.Fatal("no ClusterRole headwater-fetcher")
	}
	// Secrets and ConfigMaps sources name, the ServiceAccounts whose image
	// pull secrets an OCIRepository uses, and the sources themselves (a
	// job is checked against the live object): get, one at a time, and
	// nothing else.
	sources := []string{"gitrepositories", "buckets", "helmrepositories", "helmcharts", "ocirepositories"}
	allowed := map[string]string{"secrets": "", "configmaps": "", "serviceaccounts": ""}
	for _, r := range sources {
		allowed[r] = "source.toolkit.fluxcd.io"
	}
	for r, group := range allowed {
		if !Allows(role.Rules, group, r, "get") {
			t.Errorf("fetcher cannot get %s", r)
		}
		for _, verb := range []string{"list", "watch", "create", "update", "patch", "delete"} {
			if Allows(role.Rules, group, r, verb) {
				t.Errorf("fetcher may %s %s; it needs get only", verb, r)
			}
		}
	}
	for _, rule := range role.Rules {
		for _, r := range rule.Resources {
			if _, ok := allowed[r]; !ok {
				t.Errorf("fetcher may access %s; it needs the sources, their Secrets, ConfigMaps and ServiceAccounts only", r)
			}
		}
	}
	// The fetcher reads Secrets; no other Headwater pod carries a token
	// bound to that role.
	for _, b := range m.ClusterRoleBindings {
		if b.RoleRef.Name != role.Name {
			continue
		}
		for _, s := range b.Subjects {
			if s.Name != "fetcher" {
				t.Errorf("ClusterRole %s is bound to %s", role.Name, s.Name)
			}
		}
	}
	for _, s := range []string{"packager", "artifact-server"} {
		_, pod := container(t, m, s)
		if pod.AutomountServiceAccountToken == nil || *pod.AutomountServiceAccountToken {
			t.Errorf("%s mounts a service account token but never talks to Kubernetes", s)
		}
	}
}

// checkArtifactService checks the Service that makes artifact URLs look like
// Flux's: source-controller:80 -> artifact-server's -storage-addr.
func checkArtifactService(t *testing.T, m *Manifests) {
	t.Helper()
	svc, ok := m.Service("source-controller")
	if !ok {
		t.Fatal("no Service source-controller")
	}
	c, _ := container(t, m, "artifact-server")
	addr, ok := FlagValue(c, "storage-addr")
	if !ok {
		addr = ":9090" // the flag's default
	}
	listen, err := addrPort(addr)
	if err != nil {
		t.Fatalf("artifact-server -storage-addr %q: %v", addr, err)
	}
	found := false
	for _, p := range svc.Spec.Ports {
		if p.Port != 80 {
			continue
		}
		found = true
		port, err := ContainerPort(c, p.TargetPort)
		if err != nil {
			t.Errorf("Service source-controller: %v", err)
		} else if port != listen {
			t.Errorf("Service source-controller:80 targets %d, but the artifact-server listens on %d", port, listen)
		}
	}
	if !found {
		t.Errorf("Service source-controller has no port 80")
	}
	adv, ok := FlagValue(c, "storage-adv-addr")
	if want := "source-controller." + namespace + ".svc.cluster.local."; !ok || Expand(adv, c.Env, namespace) != want {
		t.Errorf("artifact-server -storage-adv-addr %q, want it to expand to %q", adv, want)
	}
}

// checkNATS checks the JetStream server: a StatefulSet with a volume claim,
// and a command line and configuration nats-server itself accepts with
// JetStream on that volume. It returns the server's options and the
// StatefulSet.
func checkNATS(t *testing.T, m *Manifests) (*server.Options, appsv1.StatefulSet) {
	t.Helper()
	i := slices.IndexFunc(m.StatefulSets, func(s appsv1.StatefulSet) bool { return s.Name == "nats" })
	if i < 0 {
		t.Fatal("no StatefulSet nats")
	}
	sts := m.StatefulSets[i]
	if len(sts.Spec.VolumeClaimTemplates) == 0 {
		t.Errorf("StatefulSet nats has no volumeClaimTemplates")
	}
	pod := sts.Spec.Template.Spec
	c := pod.Containers[0]
	if !strings.HasPrefix(c.Image, "nats:") {
		t.Errorf("nats image %q", c.Image)
	}
	config, ok := ArgValue(c.Args, "config")
	if !ok {
		t.Fatalf("nats: no --config argument in %v", c.Args)
	}
	var mount corev1.VolumeMount
	for _, vm := range c.VolumeMounts {
		if strings.HasPrefix(config, vm.MountPath+"/") {
			mount = vm
		}
	}
	vi := slices.IndexFunc(pod.Volumes, func(v corev1.Volume) bool { return v.Name == mount.Name })
	if vi < 0 || pod.Volumes[vi].ConfigMap == nil {
		t.Fatalf("nats: %s is not in a ConfigMap volume", config)
	}
	cm, ok := m.ConfigMap(pod.Volumes[vi].ConfigMap.Name)
	if !ok {
		t.Fatalf("nats: no ConfigMap %s", pod.Volumes[vi].ConfigMap.Name)
	}
	_, ok = cm.Data[strings.TrimPrefix(config, mount.MountPath+"/")]
	if !ok {
		t.Fatalf("nats: ConfigMap %s has no key for %s", cm.Name, config)
	}
	// Every file of the ConfigMap, as mounted (nats.conf includes
	// auth.conf), and the users' keys in the environment, as the Secret
	// headwater-nats-users provides them.
	dir := t.TempDir()
	for name, data := range cm.Data {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(data), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	file := filepath.Join(dir, filepath.Base(config))
	if !slices.ContainsFunc(c.EnvFrom, func(e corev1.EnvFromSource) bool {
		return e.SecretRef != nil && e.SecretRef.Name == "headwater-nats-users"
	}) {
		t.Errorf("nats: the users' keys (Secret headwater-nats-users) are not in its environment")
	}
	setNATSUserKeys(t)
	t.Setenv("POD_NAME", "nats-0")
	// The container's command line, with the configuration and the files
	// of mounted Secrets where this test put them: nats-server reads
	// both, as it would in the pod.
	secretDirs := map[string]string{}
	for _, vm := range c.VolumeMounts {
		vi := slices.IndexFunc(pod.Volumes, func(v corev1.Volume) bool { return v.Name == vm.Name })
		if vi >= 0 && pod.Volumes[vi].Secret != nil {
			secretDirs[vm.MountPath+"/"] = tlsSecretDir(t)
		}
	}
	var args []string
	for _, a := range c.Args {
		if strings.HasPrefix(a, "--config=") {
			a = "--config=" + file
		}
		if name, value, ok := strings.Cut(a, "="); ok {
			for mount, d := range secretDirs {
				if rest, ok := strings.CutPrefix(value, mount); ok {
					a = name + "=" + filepath.Join(d, rest)
				}
			}
		}
		args = append(args, a)
	}
	cmdline := flag.NewFlagSet("nats-server", flag.ContinueOnError)
	opts, err := server.ConfigureOptions(cmdline, args, func() {}, func() {}, func() {})
	if err != nil {
		t.Fatalf("nats-server rejects its command line %v: %v", c.Args, err)
	}
	if len(opts.Nkeys) != len(natsIdentities) || len(opts.Users) != 0 || opts.NoAuthUser != "" {
		t.Errorf("nats: %d NKey users, %d other users, no-auth user %q; want exactly Headwater's %d identities",
			len(opts.Nkeys), len(opts.Users), opts.NoAuthUser, len(natsIdentities))
	}
	for _, u := range opts.Nkeys {
		if u.Permissions == nil || u.Permissions.Publish == nil {
			t.Errorf("nats: user %s may publish anything", u.Nkey)
		}
	}
	if !opts.JetStream {
		t.Errorf("nats: JetStream is off")
	}
	if opts.ServerName != "nats-0" {
		t.Errorf("nats: server_name %q, want the pod name", opts.ServerName)
	}
	dataMounted := slices.ContainsFunc(c.VolumeMounts, func(vm corev1.VolumeMount) bool {
		return vm.MountPath == opts.StoreDir && slices.ContainsFunc(sts.Spec.VolumeClaimTemplates, func(p corev1.PersistentVolumeClaim) bool { return p.Name == vm.Name })
	})
	if !dataMounted {
		t.Errorf("nats: store_dir %q is not a volume claim", opts.StoreDir)
	}
	for _, want := range []struct {
		name string
		port int
	}{{"client", opts.Port}, {"monitor", opts.HTTPPort}} {
		got := slices.IndexFunc(c.Ports, func(p corev1.ContainerPort) bool { return p.Name == want.name && int(p.ContainerPort) == want.port })
		if got < 0 {
			t.Errorf("nats: no container port %s = %d (the configuration's)", want.name, want.port)
		}
	}
	return opts, sts
}

// tlsSecretDir writes what a TLS Secret with a ca.crt holds, made up for
// the test: an authority (ca.crt) and a certificate it signed for the
// nats Service (tls.crt, tls.key).
func tlsSecretDir(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test ca"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	leaf := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "nats"}, DNSNames: []string{"nats"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, leaf, caTmpl, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	for name, block := range map[string]*pem.Block{
		"ca.crt":  {Type: "CERTIFICATE", Bytes: caDER},
		"tls.crt": {Type: "CERTIFICATE", Bytes: der},
		"tls.key": {Type: "EC PRIVATE KEY", Bytes: keyDER},
	} {
		if err := os.WriteFile(filepath.Join(dir, name), pem.EncodeToMemory(block), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// TestNATSTLSComponent checks components/nats-tls: nats-server, given its
// command line, requires TLS with verified client certificates from the
// Secret headwater-nats-tls; every service connects with -nats-ca,
// -nats-cert and -nats-key from files of the Secret
// headwater-nats-client-tls.
func TestNATSTLSComponent(t *testing.T) {
	m, _ := buildWith(t, "nats-tls")
	opts, sts := checkNATS(t, m)
	if opts.TLSConfig == nil || !opts.TLSVerify || opts.AllowNonTLS {
		t.Errorf("nats: TLS %v, verify %v, non-TLS allowed %v: want TLS with client certificates only",
			opts.TLSConfig != nil, opts.TLSVerify, opts.AllowNonTLS)
	}
	if !slices.ContainsFunc(sts.Spec.Template.Spec.Volumes, func(v corev1.Volume) bool {
		return v.Secret != nil && v.Secret.SecretName == natsTLSSecret
	}) {
		t.Errorf("nats: Secret %s is not mounted", natsTLSSecret)
	}
	for _, s := range Services {
		c, pod := container(t, m, s)
		for _, flag := range []string{"nats-ca", "nats-cert", "nats-key"} {
			file, ok := FlagValue(c, flag)
			if !ok {
				t.Errorf("%s: -%s is not set", s, flag)
				continue
			}
			mounted := slices.ContainsFunc(c.VolumeMounts, func(vm corev1.VolumeMount) bool {
				vi := slices.IndexFunc(pod.Volumes, func(v corev1.Volume) bool { return v.Name == vm.Name })
				return strings.HasPrefix(file, vm.MountPath+"/") && vi >= 0 && pod.Volumes[vi].Secret != nil &&
					pod.Volumes[vi].Secret.SecretName == natsClientTLSSecret
			})
			if !mounted {
				t.Errorf("%s: -%s=%s is not a file of the mounted Secret %s", s, flag, file, natsClientTLSSecret)
			}
		}
	}
}

// TestDeployS3Overlay checks overlays/s3: the CRDs and deploy/base on the
// user's S3 (the Secret headwater-s3 theirs).
func TestDeployS3Overlay(t *testing.T) {
	m, _ := build(t, filepath.Join("deploy", "overlays", "s3"))
	if len(m.PVCs) != 0 {
		t.Errorf("the S3 overlay keeps PVCs %v", m.Names("PersistentVolumeClaim"))
	}
	for _, s := range Services {
		if !m.Has("Deployment", s) {
			t.Errorf("the S3 overlay lost Deployment %s", s)
		}
	}
	if len(m.CRDs) == 0 {
		t.Errorf("the S3 overlay installs no CRDs")
	}
	checkS3Storage(t, m)
	checkSetup(t, m, false)
}

// checkS3Storage checks that every storage service uses the s3 backend
// with the settings of the Secret headwater-s3, creating the bucket, and
// mounts no /data.
func checkS3Storage(t *testing.T, m *Manifests) {
	t.Helper()
	for _, s := range storageServices {
		c, pod := container(t, m, s)
		if v, _ := FlagValue(c, "storage-backend"); v != "s3" {
			t.Errorf("%s: -storage-backend=%q, want s3", s, v)
		}
		if v, _ := FlagValue(c, "storage-s3-create-bucket"); v != "true" {
			t.Errorf("%s: -storage-s3-create-bucket=%q, want true (MinIO starts empty)", s, v)
		}
		if _, ok := EnvVar(c, EnvName("storage-path")); ok {
			t.Errorf("%s: still sets %s", s, EnvName("storage-path"))
		}
		for _, v := range pod.Volumes {
			if v.PersistentVolumeClaim != nil {
				t.Errorf("%s: still mounts PVC %s", s, v.PersistentVolumeClaim.ClaimName)
			}
		}
		for _, vm := range c.VolumeMounts {
			if vm.MountPath == "/data" {
				t.Errorf("%s: still mounts /data", s)
			}
		}
		for flag, key := range map[string]string{
			"storage-s3-access-key": "accesskey",
			"storage-s3-secret-key": "secretkey",
			"storage-s3-bucket":     "bucket",
			"storage-s3-endpoint":   "endpoint",
		} {
			e, ok := EnvVar(c, EnvName(flag))
			if !ok || e.ValueFrom == nil || e.ValueFrom.SecretKeyRef == nil ||
				e.ValueFrom.SecretKeyRef.Name != s3Secret || e.ValueFrom.SecretKeyRef.Key != key {
				t.Errorf("%s: %s does not come from Secret %s key %s", s, EnvName(flag), s3Secret, key)
			}
			if ok && e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil &&
				e.ValueFrom.SecretKeyRef.Optional != nil && *e.ValueFrom.SecretKeyRef.Optional {
				t.Errorf("%s: %s is optional", s, EnvName(flag))
			}
		}
	}
}

// TestKEDAExample checks the sample ScaledObjects against the bus contract:
// the stream and consumer names in pkg/events and the nats Service.
func TestKEDAExample(t *testing.T) {
	root := repoRoot(t)
	m, err := Build(filepath.Join(root, "deploy"))
	if err != nil {
		t.Fatal(err)
	}
	events, err := os.ReadFile(filepath.Join(root, "pkg", "events", "streams.go"))
	if err != nil {
		t.Fatal(err)
	}
	constant := func(name string) string {
		t.Helper()
		mm := regexp.MustCompile(name + `\s*=\s*"([^"]+)"`).FindSubmatch(events)
		if mm == nil {
			t.Fatalf("pkg/events/streams.go: no constant %s", name)
		}
		return string(mm[1])
	}
	want := map[string][2]string{
		"fetcher":  {constant("FetchStream"), constant("FetcherConsumer")},
		"packager": {constant("PackageStream"), constant("PackagerConsumer")},
	}

	b, err := os.ReadFile(filepath.Join(root, "deploy", "examples", "keda-scaledobjects.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	type scaledObject struct {
		Kind     string `json:"kind"`
		Metadata struct {
			Namespace string `json:"namespace"`
		} `json:"metadata"`
		Spec struct {
			ScaleTargetRef struct {
				Name string `json:"name"`
			} `json:"scaleTargetRef"`
			MinReplicaCount *int `json:"minReplicaCount"`
			MaxReplicaCount *int `json:"maxReplicaCount"`
			Triggers        []struct {
				Type     string            `json:"type"`
				Metadata map[string]string `json:"metadata"`
			} `json:"triggers"`
		} `json:"spec"`
	}
	seen := map[string]bool{}
	for _, doc := range regexp.MustCompile(`(?m)^---\s*$`).Split(string(b), -1) {
		var so scaledObject
		if err := yaml.Unmarshal([]byte(doc), &so); err != nil {
			t.Fatal(err)
		}
		if so.Kind != "ScaledObject" {
			continue
		}
		target := so.Spec.ScaleTargetRef.Name
		seen[target] = true
		w, ok := want[target]
		if !ok {
			t.Errorf("ScaledObject scales %q, not the fetcher or the packager", target)
			continue
		}
		if so.Metadata.Namespace != namespace {
			t.Errorf("ScaledObject for %s in namespace %q", target, so.Metadata.Namespace)
		}
		if so.Spec.MinReplicaCount == nil || *so.Spec.MinReplicaCount < 1 {
			t.Errorf("ScaledObject for %s may scale to zero: a pending job would wait for the first poll", target)
		}
		var jetstream, waiting []map[string]string
		for _, tr := range so.Spec.Triggers {
			switch tr.Type {
			case "nats-jetstream":
				jetstream = append(jetstream, tr.Metadata)
			case "prometheus":
				waiting = append(waiting, tr.Metadata)
			default:
				t.Errorf("ScaledObject for %s: trigger of type %q", target, tr.Type)
			}
		}
		// The watcher's backlog gate (on by default) holds a flood of
		// fetch jobs in the watcher, where num_pending does not see it:
		// the fetchers scale on the watcher's waiting jobs too.
		if target == "fetcher" && (len(waiting) != 1 || !strings.Contains(waiting[0]["query"], "headwater_fairshare_waiting_jobs")) {
			t.Errorf("ScaledObject for the fetcher: want one prometheus trigger on headwater_fairshare_waiting_jobs, got %v", waiting)
		}
		if target != "fetcher" && len(waiting) != 0 {
			t.Errorf("ScaledObject for %s: a prometheus trigger; only the fetchers' jobs wait in the watcher", target)
		}
		if len(jetstream) != 1 {
			t.Errorf("ScaledObject for %s: want one nats-jetstream trigger, got %d", target, len(jetstream))
			continue
		}
		md := jetstream[0]
		if md["stream"] != w[0] || md["consumer"] != w[1] {
			t.Errorf("ScaledObject for %s: stream/consumer %s/%s, want %s/%s", target, md["stream"], md["consumer"], w[0], w[1])
		}
		host, port, err := net.SplitHostPort(md["natsServerMonitoringEndpoint"])
		name, ns, _ := strings.Cut(host, ".")
		ns, _, _ = strings.Cut(ns, ".")
		svc, ok := m.Service(name)
		if err != nil || !ok || ns != namespace || !slices.ContainsFunc(svc.Spec.Ports, func(p corev1.ServicePort) bool { return itoa(p.Port) == port }) {
			t.Errorf("ScaledObject for %s: monitoring endpoint %q is not a port of a Service in %s", target, md["natsServerMonitoringEndpoint"], namespace)
		}
	}
	for target := range want {
		if !seen[target] {
			t.Errorf("no ScaledObject for %s", target)
		}
	}

	// Where NetworkPolicies are enforced, KEDA (namespace keda) must be
	// let in to the NATS monitoring port, which base admits from
	// Headwater's pods only.
	np := &Manifests{}
	for _, doc := range regexp.MustCompile(`(?m)^---\s*$`).Split(string(b), -1) {
		var tm metav1.TypeMeta
		if err := yaml.Unmarshal([]byte(doc), &tm); err != nil || tm.Kind != "NetworkPolicy" {
			continue
		}
		if err := np.Add([]byte(doc)); err != nil {
			t.Fatal(err)
		}
	}
	np.StatefulSets = m.StatefulSets
	for _, p := range CheckNetworkPolicies(np) {
		t.Error(p)
	}
	admitted := slices.ContainsFunc(np.NetworkPolicies, func(p networkingv1.NetworkPolicy) bool {
		return p.Namespace == namespace && p.Spec.PodSelector.MatchLabels["app.kubernetes.io/name"] == "nats" &&
			slices.ContainsFunc(p.Spec.Ingress, func(r networkingv1.NetworkPolicyIngressRule) bool {
				return slices.ContainsFunc(r.From, func(peer networkingv1.NetworkPolicyPeer) bool {
					return peer.NamespaceSelector != nil && peer.NamespaceSelector.MatchLabels["kubernetes.io/metadata.name"] == "keda"
				}) && slices.ContainsFunc(r.Ports, func(p networkingv1.NetworkPolicyPort) bool { return p.Port != nil && p.Port.String() == "monitor" })
			})
	})
	if !admitted {
		t.Errorf("examples/keda-scaledobjects.yaml: no NetworkPolicy admits the keda namespace to NATS's monitor port")
	}
}

// mountsEmptyDir reports whether c mounts an emptyDir at path.
func mountsEmptyDir(c corev1.Container, pod corev1.PodSpec, path string) bool {
	for _, vm := range c.VolumeMounts {
		if vm.MountPath != path {
			continue
		}
		for _, v := range pod.Volumes {
			if v.Name == vm.Name && v.EmptyDir != nil {
				return true
			}
		}
	}
	return false
}

// mountedClaim returns the PVC c mounts at path, if any.
func mountedClaim(c corev1.Container, pod corev1.PodSpec, path string) string {
	for _, vm := range c.VolumeMounts {
		if vm.MountPath != path {
			continue
		}
		for _, v := range pod.Volumes {
			if v.Name == vm.Name && v.PersistentVolumeClaim != nil {
				return v.PersistentVolumeClaim.ClaimName
			}
		}
	}
	return ""
}

func itoa(i int32) string { return strconv.Itoa(int(i)) }

// TestDeployBaseAlone checks that deploy/base is deploy/ without the CRDs
// and the MinIO component, for clusters that have Flux's CRDs already and
// an S3 service.
func TestDeployBaseAlone(t *testing.T) {
	m, _ := build(t, filepath.Join("deploy", "base"))
	full, err := Build(filepath.Join(repoRoot(t), "deploy"))
	if err != nil {
		t.Fatal(err)
	}
	if len(m.CRDs) != 0 {
		t.Errorf("deploy/base installs CRDs %v", m.Names("CustomResourceDefinition"))
	}
	var extra []string
	baseIDs := ids(m)
	for _, id := range ids(full) {
		if !slices.Contains(baseIDs, id) && !strings.HasPrefix(id, "CustomResourceDefinition/") {
			extra = append(extra, id)
		}
	}
	slices.Sort(extra)
	if want := []string{"NetworkPolicy/minio", "Service/minio", "ServiceAccount/minio", "StatefulSet/minio"}; !slices.Equal(extra, want) ||
		m.Count != full.Count-len(full.CRDs)-len(want) {
		t.Errorf("deploy/ has %v more than deploy/base (%d resources, deploy/ %d of which %d CRDs), want the CRDs and %v",
			extra, m.Count, full.Count, len(full.CRDs), want)
	}
	checkS3Storage(t, m)
	checkSetup(t, m, false)
}

// checkNATSCluster checks a clustered NATS: nats-server, given its command
// line, routes to every pod of the StatefulSet through its governing
// Service, on the port the container and that Service name; a
// PodDisruptionBudget keeps a quorum; only NATS pods reach the cluster
// port; and every service keeps each stream in as many copies as there
// are servers.
func checkNATSCluster(t *testing.T, m *Manifests) {
	t.Helper()
	opts, sts := checkNATS(t, m)
	replicas := int(*sts.Spec.Replicas)
	if replicas != 3 {
		t.Errorf("nats: %d replicas, want 3", replicas)
	}
	if opts.Cluster.Name == "" || opts.Cluster.Port == 0 {
		t.Fatalf("nats: no cluster (name %q, port %d)", opts.Cluster.Name, opts.Cluster.Port)
	}
	var routes []string
	for _, r := range opts.Routes {
		routes = append(routes, r.Host)
	}
	var want []string
	for i := range replicas {
		want = append(want, net.JoinHostPort(sts.Name+"-"+strconv.Itoa(i)+"."+sts.Spec.ServiceName, strconv.Itoa(opts.Cluster.Port)))
	}
	if !slices.Equal(routes, want) {
		t.Errorf("nats: routes %v, want every pod %v", routes, want)
	}
	c := sts.Spec.Template.Spec.Containers[0]
	if !slices.ContainsFunc(c.Ports, func(p corev1.ContainerPort) bool {
		return p.Name == "cluster" && int(p.ContainerPort) == opts.Cluster.Port
	}) {
		t.Errorf("nats: no container port cluster = %d", opts.Cluster.Port)
	}
	headless, ok := m.Service(sts.Spec.ServiceName)
	if !ok || headless.Spec.ClusterIP != corev1.ClusterIPNone {
		t.Fatalf("nats: governing Service %s is not headless", sts.Spec.ServiceName)
	}
	if !slices.ContainsFunc(headless.Spec.Ports, func(p corev1.ServicePort) bool { return int(p.Port) == opts.Cluster.Port }) {
		t.Errorf("nats: Service %s has no port %d", headless.Name, opts.Cluster.Port)
	}
	pdb := slices.IndexFunc(m.PDBs, func(p policyv1.PodDisruptionBudget) bool {
		return p.Spec.Selector != nil && p.Spec.Selector.MatchLabels["app.kubernetes.io/name"] == "nats"
	})
	if pdb < 0 || m.PDBs[pdb].Spec.MaxUnavailable == nil || m.PDBs[pdb].Spec.MaxUnavailable.IntValue() != 1 {
		t.Errorf("nats: no PodDisruptionBudget with maxUnavailable 1")
	}
	if !slices.ContainsFunc(m.NetworkPolicies, func(np networkingv1.NetworkPolicy) bool {
		return np.Spec.PodSelector.MatchLabels["app.kubernetes.io/name"] == "nats" && slices.ContainsFunc(np.Spec.Ingress,
			func(r networkingv1.NetworkPolicyIngressRule) bool {
				return slices.ContainsFunc(r.Ports, func(p networkingv1.NetworkPolicyPort) bool { return p.Port != nil && p.Port.String() == "cluster" })
			})
	}) {
		t.Errorf("nats: no NetworkPolicy admits the cluster port")
	}
	for _, s := range Services {
		c, _ := container(t, m, s)
		if v, _ := FlagValue(c, "nats-stream-replicas"); v != strconv.Itoa(replicas) {
			t.Errorf("%s: -nats-stream-replicas=%q, want %d (the NATS servers)", s, v, replicas)
		}
	}
}

// TestNATSClusterComponent checks components/nats-cluster on deploy/base.
func TestNATSClusterComponent(t *testing.T) {
	m, _ := buildWith(t, "nats-cluster")
	checkNATSCluster(t, m)
}

// TestDeployProductionOverlay checks overlays/production: the 3-node
// cluster and TLS together, with everything deploy/base has.
func TestDeployProductionOverlay(t *testing.T) {
	m, _ := build(t, filepath.Join("deploy", "overlays", "production"))
	checkNATSCluster(t, m)
	opts, _ := checkNATS(t, m)
	if opts.TLSConfig == nil || !opts.TLSVerify {
		t.Errorf("nats: TLS %v, verify %v: want TLS with client certificates", opts.TLSConfig != nil, opts.TLSVerify)
	}
	for _, s := range Services {
		c, _ := container(t, m, s)
		if _, ok := FlagValue(c, "nats-cert"); !ok {
			t.Errorf("%s: no client certificate for NATS", s)
		}
	}
	base, err := Build(filepath.Join(repoRoot(t), "deploy", "base"))
	if err != nil {
		t.Fatal(err)
	}
	if m.Count != base.Count+len(m.CRDs)+2 || len(m.CRDs) == 0 {
		t.Errorf("overlays/production renders %d resources, want the %d CRDs, deploy/base's %d and a PodDisruptionBudget and a NetworkPolicy",
			m.Count, len(m.CRDs), base.Count)
	}
	checkS3Storage(t, m)
	checkSetup(t, m, false)
}

// TestReceiversComponent checks components/receivers: the Receiver CRD,
// the receiver Deployment behind Flux's Service name webhook-receiver,
// reachable on its webhook port, with the least rights (list and watch
// Receivers, get Secrets, never list them or write anything); the
// watcher with -receivers and the rights to write Receivers' status.
func TestReceiversComponent(t *testing.T) {
	m, flags := buildWith(t, "receivers")
	for kind, names := range map[string][]string{
		"CustomResourceDefinition": {"receivers.notification.toolkit.fluxcd.io"},
		"Deployment":               {"receiver"},
		"Service":                  {"webhook-receiver"},
		"ServiceAccount":           {"receiver"},
		"ClusterRole":              {"headwater-receiver", "headwater-watcher-receivers"},
		"ClusterRoleBinding":       {"headwater-receiver", "headwater-watcher-receivers"},
		"NetworkPolicy":            {"receiver"},
	} {
		for _, n := range names {
			if !m.Has(kind, n) {
				t.Errorf("no %s %s (have %v)", kind, n, m.Names(kind))
			}
		}
	}

	c, _ := container(t, m, "receiver")
	for _, p := range CheckEnv("receiver", flags["receiver"], envNames(c)) {
		t.Error(p)
	}
	if u, ok := FlagValue(c, "nats-url"); !ok {
		t.Error("receiver: -nats-url is not set")
	} else {
		checkNATSURL(t, m, "receiver", u)
	}
	addr, ok := FlagValue(c, "receiver-addr")
	if !ok {
		t.Fatal("receiver: -receiver-addr is not set")
	}
	port, err := addrPort(addr)
	if err != nil {
		t.Fatal(err)
	}
	svc, _ := m.Service("webhook-receiver")
	if len(svc.Spec.Ports) != 1 || svc.Spec.Ports[0].Port != 80 {
		t.Errorf("Service webhook-receiver: ports %v, want 80 as Flux's", svc.Spec.Ports)
	} else if p, err := ContainerPort(c, svc.Spec.Ports[0].TargetPort); err != nil || p != port {
		t.Errorf("Service webhook-receiver targets port %d (%v), the receiver listens on %d", p, err, port)
	}

	rr, _ := m.ClusterRole("headwater-receiver")
	for _, verb := range []string{"get", "list", "watch"} {
		if !Allows(rr.Rules, "notification.toolkit.fluxcd.io", "receivers", verb) {
			t.Errorf("receiver cannot %s receivers", verb)
		}
	}
	// It watches the token Secrets one by one (field selector
	// metadata.name): list and watch, nothing else.
	for _, verb := range []string{"list", "watch"} {
		if !Allows(rr.Rules, "", "secrets", verb) {
			t.Errorf("receiver cannot %s the token Secrets", verb)
		}
	}
	for _, verb := range []string{"get", "create", "update", "patch", "delete"} {
		if Allows(rr.Rules, "", "secrets", verb) {
			t.Errorf("receiver may %s Secrets; it needs list and watch only", verb)
		}
		if verb != "list" && verb != "watch" && Allows(rr.Rules, "notification.toolkit.fluxcd.io", "receivers/status", verb) {
			t.Errorf("receiver may %s receivers' status; only the watcher writes", verb)
		}
	}

	wr, _ := m.ClusterRole("headwater-watcher-receivers")
	if !Allows(wr.Rules, "notification.toolkit.fluxcd.io", "receivers/status", "patch") {
		t.Error("watcher cannot patch receivers' status")
	}
	if Allows(wr.Rules, "", "secrets", "list") {
		t.Error("watcher may list Secrets; it gets the one a Receiver names")
	}
	w, _ := container(t, m, "watcher")
	if v, ok := FlagValue(w, "receivers"); !ok || v != "true" {
		t.Errorf("watcher: -receivers %q, want true", v)
	}
}

// envNames lists the names of a container's environment variables.
func envNames(c corev1.Container) []string {
	var names []string
	for _, e := range c.Env {
		names = append(names, e.Name)
	}
	return names
}

// TestMonitoringComponent checks components/monitoring on deploy/base: a
// PodMonitor per service that selects the service's pods and scrapes
// /metrics on a port the container declares; the four alerts of the
// PrometheusRule, each with an expression; the Grafana dashboard, valid
// JSON in a ConfigMap Grafana's sidecar loads, whose panels all query.
func TestMonitoringComponent(t *testing.T) {
	m, _ := buildWith(t, "monitoring")
	for _, s := range Services {
		i := slices.IndexFunc(m.PodMonitors, func(p PodMonitor) bool { return p.Name == "headwater-"+s })
		if i < 0 {
			t.Errorf("no PodMonitor headwater-%s", s)
			continue
		}
		pm := m.PodMonitors[i]
		d, ok := m.Deployment(s)
		if !ok {
			t.Fatalf("no Deployment %s", s)
		}
		sel, err := metav1.LabelSelectorAsSelector(&pm.Spec.Selector)
		if err != nil || !sel.Matches(labels.Set(d.Spec.Template.Labels)) {
			t.Errorf("PodMonitor %s selects %v, not the pods of %s (%v): %v", pm.Name, pm.Spec.Selector, s, d.Spec.Template.Labels, err)
		}
		c, _ := container(t, m, s)
		if len(pm.Spec.PodMetricsEndpoints) != 1 {
			t.Fatalf("PodMonitor %s has %d endpoints", pm.Name, len(pm.Spec.PodMetricsEndpoints))
		}
		ep := pm.Spec.PodMetricsEndpoints[0]
		port := slices.IndexFunc(c.Ports, func(p corev1.ContainerPort) bool { return p.Name == ep.Port })
		addr, _ := EnvValue(c, "HEADWATER_TELEMETRY_ADDR")
		if port < 0 || ep.Path != "/metrics" || !strings.HasSuffix(addr, ":"+itoa(c.Ports[max(port, 0)].ContainerPort)) {
			t.Errorf("PodMonitor %s scrapes port %q path %s; the container's ports %v, telemetry on %q", pm.Name, ep.Port, ep.Path, c.Ports, addr)
		}
	}

	if len(m.PrometheusRules) != 1 {
		t.Fatalf("%d PrometheusRules", len(m.PrometheusRules))
	}
	alerts := map[string]string{}
	for _, g := range m.PrometheusRules[0].Spec.Groups {
		for _, r := range g.Rules {
			alerts[r.Alert] = r.Expr
		}
	}
	for _, a := range []string{"HeadwaterQueueStuck", "HeadwaterSourceFailing", "HeadwaterSinkDead", "HeadwaterServiceDown"} {
		if strings.TrimSpace(alerts[a]) == "" {
			t.Errorf("no alert %s with an expression in %v", a, alerts)
		}
	}

	cm, ok := m.ConfigMap("headwater-dashboard")
	if !ok || cm.Labels["grafana_dashboard"] != "1" {
		t.Fatalf("no ConfigMap headwater-dashboard labelled grafana_dashboard=1 (%v)", cm.Labels)
	}
	var dashboard struct {
		UID    string `json:"uid"`
		Panels []struct {
			Type    string `json:"type"`
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal([]byte(cm.Data["headwater.json"]), &dashboard); err != nil {
		t.Fatalf("the dashboard is no JSON: %v", err)
	}
	queries := 0
	for _, p := range dashboard.Panels {
		if p.Type == "row" {
			continue
		}
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for _, target := range p.Targets {
			if !strings.Contains(target.Expr, "headwater_") {
				t.Errorf("panel %q queries %q, no Headwater metric", p.Title, target.Expr)
			}
			queries++
		}
	}
	if dashboard.UID == "" || queries < 10 {
		t.Errorf("dashboard uid %q with %d queries", dashboard.UID, queries)
	}
}

// TestDispatcherComponent builds deploy/base with components/dispatcher:
// the dispatcher runs with its own bus identity and ServiceAccount, bound to
// the generated ClusterRole, and NATS admits it.
func TestDispatcherComponent(t *testing.T) {
	m, _ := buildWith(t, "dispatcher")
	for kind, name := range map[string]string{"Deployment": "dispatcher", "ServiceAccount": "dispatcher",
		"ClusterRole": "headwater-dispatcher", "ClusterRoleBinding": "headwater-dispatcher"} {
		if !m.Has(kind, name) {
			t.Errorf("no %s %s (have %v)", kind, name, m.Names(kind))
		}
	}
	c, pod := container(t, m, "dispatcher")
	if u, ok := FlagValue(c, "nats-url"); !ok {
		t.Error("dispatcher: -nats-url is not set")
	} else {
		checkNATSURL(t, m, "dispatcher", u)
	}
	if !slices.ContainsFunc(pod.Volumes, func(v corev1.Volume) bool {
		return v.Secret != nil && v.Secret.SecretName == "headwater-nats-dispatcher"
	}) {
		t.Error("dispatcher: its bus identity (Secret headwater-nats-dispatcher) is not mounted")
	}
	d, _ := m.Deployment("dispatcher")
	if d.Spec.Template.Labels["app.kubernetes.io/part-of"] != "headwater" {
		t.Error("dispatcher: pods lack app.kubernetes.io/part-of=headwater, so the NetworkPolicy keeps them from NATS")
	}
}

// TestNATSExternalComponent checks components/nats-external, with the
// components that add services of their own: no bundled NATS is left, and
// every service dials the URL of the Secret headwater-nats-external as
// its own identity.
func TestNATSExternalComponent(t *testing.T) {
	m, _ := buildWith(t, "receivers", "dispatcher", "nats-external")
	for _, kind := range []string{"StatefulSet", "Service", "ServiceAccount", "NetworkPolicy", "PodDisruptionBudget", "ConfigMap"} {
		for _, name := range m.Names(kind) {
			if strings.HasPrefix(name, "nats") {
				t.Errorf("%s %s of the bundled NATS is still installed", kind, name)
			}
		}
	}
	for _, s := range []string{"watcher", "fetcher", "packager", "artifact-server", "receiver", "dispatcher"} {
		c, _ := container(t, m, s)
		var url *corev1.EnvVar
		for i, e := range c.Env {
			if e.Name == "HEADWATER_NATS_URL" {
				url = &c.Env[i]
			}
		}
		switch {
		case url == nil:
			t.Errorf("%s: no HEADWATER_NATS_URL", s)
		case url.Value != "" || url.ValueFrom == nil || url.ValueFrom.SecretKeyRef == nil ||
			url.ValueFrom.SecretKeyRef.Name != natsExternalSecret || url.ValueFrom.SecretKeyRef.Key != "url":
			t.Errorf("%s: HEADWATER_NATS_URL is %+v, want the key url of the Secret %s", s, *url, natsExternalSecret)
		}
		if _, ok := FlagValue(c, "nats-nkey"); !ok {
			t.Errorf("%s: no -nats-nkey: it must keep its own identity", s)
		}
	}
}

// TestShardsComponent checks components/shards: the watcher becomes the
// main shard (!sharding.fluxcd.io/key, reporting the sources no shard
// selects), and watcher-shard1 and watcher-shard2 are copies of it with
// their own selector, ServiceAccount bound to the watcher's ClusterRole,
// pods the main watcher's selector does not select, the same image and
// bus identity, and the label the NetworkPolicies admit.
func TestShardsComponent(t *testing.T) {
	m, flags := buildWith(t, "shards")
	main, mainPod := container(t, m, "watcher")
	if v, ok := FlagValue(main, "watch-label-selector"); !ok || v != "!sharding.fluxcd.io/key" {
		t.Errorf("watcher: -watch-label-selector %q, want the main shard's", v)
	}
	if v, ok := FlagValue(main, "fleet-selectors"); !ok || !strings.Contains(v, "sharding.fluxcd.io/key in (shard1,shard2)") {
		t.Errorf("watcher: -fleet-selectors %q, want every shard's", v)
	}
	mainDeploy, _ := m.Deployment("watcher")
	for _, shard := range []string{"shard1", "shard2"} {
		name := "watcher-" + shard
		d, ok := m.Deployment(name)
		if !ok {
			t.Fatalf("no Deployment %s (have %v)", name, m.Names("Deployment"))
		}
		var c corev1.Container
		for _, cc := range d.Spec.Template.Spec.Containers {
			if cc.Name == "watcher" {
				c = cc
			}
		}
		for _, p := range CheckEnv("watcher", flags["watcher"], envNames(c)) {
			t.Errorf("%s: %v", name, p)
		}
		if v, ok := FlagValue(c, "watch-label-selector"); !ok || v != "sharding.fluxcd.io/key in ("+shard+")" {
			t.Errorf("%s: -watch-label-selector %q", name, v)
		}
		if _, ok := FlagValue(c, "fleet-selectors"); ok {
			t.Errorf("%s reports unowned sources too; the main shard does", name)
		}
		if c.Image != main.Image || c.Image == "headwater/headwater" {
			t.Errorf("%s runs %q, the main watcher %q", name, c.Image, main.Image)
		}
		pod := d.Spec.Template.Spec
		if pod.ServiceAccountName != name {
			t.Errorf("%s runs as %q, want its own ServiceAccount", name, pod.ServiceAccountName)
		}
		if !m.Has("ServiceAccount", name) || !m.Has("ClusterRoleBinding", "headwater-watcher-"+shard) ||
			!m.Has("RoleBinding", "headwater-watcher-leader-election-"+shard) || !m.Has("PodDisruptionBudget", name) {
			t.Errorf("%s lacks its ServiceAccount, bindings or PodDisruptionBudget", name)
		}
		if !reflect.DeepEqual(pod.Volumes, mainPod.Volumes) {
			t.Errorf("%s mounts %v, the main watcher %v (the watcher's bus identity)", name, pod.Volumes, mainPod.Volumes)
		}
		if sel := mainDeploy.Spec.Selector.MatchLabels; labels.SelectorFromSet(sel).Matches(labels.Set(d.Spec.Template.Labels)) {
			t.Errorf("the main watcher's selector %v selects %s's pods", sel, name)
		}
		if d.Spec.Template.Labels["app.kubernetes.io/part-of"] != "headwater" {
			t.Errorf("%s's pods lack app.kubernetes.io/part-of: headwater, which the NetworkPolicies admit", name)
		}
	}
}

// TestNoCrossNamespaceRefsComponent checks components/no-cross-namespace-refs
// after components/dispatcher, as docs/security.md tells users to add it:
// the watcher, the packager and the dispatcher, the services that resolve
// a tenant's reference to another namespace, run with
// -no-cross-namespace-refs on (a flag each of them has), and the others
// are left as they were.
func TestNoCrossNamespaceRefsComponent(t *testing.T) {
	m, flags := buildWith(t, "dispatcher", "no-cross-namespace-refs")
	for _, name := range []string{"watcher", "packager", "dispatcher"} {
		c, _ := container(t, m, name)
		if _, ok := flags[name]["no-cross-namespace-refs"]; !ok {
			t.Errorf("%s has no flag -no-cross-namespace-refs", name)
		}
		if v, ok := FlagValue(c, "no-cross-namespace-refs"); !ok || v != "true" {
			t.Errorf("%s: -no-cross-namespace-refs = %q (set %v), want true", name, v, ok)
		}
		for _, p := range CheckEnv(name, flags[name], envNames(c)) {
			t.Error(p)
		}
	}
	for _, name := range []string{"fetcher", "artifact-server"} {
		c, _ := container(t, m, name)
		if v, ok := FlagValue(c, "no-cross-namespace-refs"); ok {
			t.Errorf("%s: -no-cross-namespace-refs = %q, want it unset", name, v)
		}
	}
}
