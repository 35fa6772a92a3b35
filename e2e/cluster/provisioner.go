package cluster

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// provisioner is the node's storage: for every PersistentVolumeClaim that
// names no StorageClass (the node has no default one) it makes a hostPath
// PersistentVolume bound to the claim, as a cloud's provisioner would make a
// disk. Its directories are world-writable, because hostPath volumes ignore
// fsGroup. ReadWriteMany is granted too: on one node any volume is shared.
type provisioner struct {
	client kubernetes.Interface
	dir    string
	logf   func(format string, args ...any)

	mu sync.Mutex
	// limits are the sizes of the filesystems the claims named in it get:
	// a tmpfs of that size, so a test can fill a volume.
	limits map[string]string
}

func (p *provisioner) setLimit(claim, size string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if size == "" {
		delete(p.limits, claim)
		return
	}
	p.limits[claim] = size
}

func (p *provisioner) limit(claim string) (string, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	size, ok := p.limits[claim]
	return size, ok
}

// run provisions until ctx ends.
func (p *provisioner) run(ctx context.Context) {
	t := time.NewTicker(500 * time.Millisecond)
	defer t.Stop()
	for {
		if err := p.once(ctx); err != nil && ctx.Err() == nil {
			p.logf("provisioner: %v", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func (p *provisioner) once(ctx context.Context) error {
	claims, err := p.client.CoreV1().PersistentVolumeClaims("").List(ctx, metav1.ListOptions{})
	if err != nil {
		return fmt.Errorf("list claims: %w", err)
	}
	for i := range claims.Items {
		c := &claims.Items[i]
		if c.Spec.VolumeName != "" || c.Status.Phase != corev1.ClaimPending ||
			(c.Spec.StorageClassName != nil && *c.Spec.StorageClassName != "") {
			continue
		}
		if err := p.provision(ctx, c); err != nil {
			return err
		}
	}
	return nil
}

func (p *provisioner) provision(ctx context.Context, c *corev1.PersistentVolumeClaim) error {
	name := "pv-" + string(c.UID)
	dir := filepath.Join(p.dir, c.Namespace+"-"+c.Name+"-"+string(c.UID)[:8])
	if err := os.MkdirAll(dir, 0o777); err != nil {
		return fmt.Errorf("volume %s: %w", dir, err)
	}
	if err := os.Chmod(dir, 0o777); err != nil {
		return fmt.Errorf("volume %s: %w", dir, err)
	}
	if size, ok := p.limit(c.Name); ok {
		if err := mountTmpfs(dir, size); err != nil {
			return fmt.Errorf("volume %s: %w", dir, err)
		}
	}
	size := c.Spec.Resources.Requests[corev1.ResourceStorage]
	hostPathType := corev1.HostPathDirectory
	pv := &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"headwater.test/provisioner": "hostpath"}},
		Spec: corev1.PersistentVolumeSpec{
			Capacity:                      corev1.ResourceList{corev1.ResourceStorage: size},
			AccessModes:                   c.Spec.AccessModes,
			PersistentVolumeReclaimPolicy: corev1.PersistentVolumeReclaimRetain,
			ClaimRef: &corev1.ObjectReference{
				Kind: "PersistentVolumeClaim", APIVersion: "v1",
				Namespace: c.Namespace, Name: c.Name, UID: c.UID,
			},
			PersistentVolumeSource: corev1.PersistentVolumeSource{
				HostPath: &corev1.HostPathVolumeSource{Path: dir, Type: &hostPathType},
			},
		},
	}
	if _, err := p.client.CoreV1().PersistentVolumes().Create(ctx, pv, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("create volume for %s/%s: %w", c.Namespace, c.Name, err)
	}
	p.logf("provisioner: %s/%s bound to %s (%s)", c.Namespace, c.Name, dir, size.String())
	return nil
}
