package cluster

import (
	"bytes"
	"context"
	"io"
	"os/exec"
	"path/filepath"
)

// KubectlCmd is a kubectl command against the cluster as its
// administrator.
type KubectlCmd struct {
	cmd *exec.Cmd
}

// Kubectl returns kubectl with args, run as the cluster's administrator
// (the binary built with the API server, so versions never skew).
func (c *Cluster) Kubectl(ctx context.Context, args ...string) *KubectlCmd {
	cmd := exec.CommandContext(ctx, filepath.Join(c.opts.KubeDir, "kubectl"), append([]string{"--kubeconfig", c.Kubeconfig}, args...)...)
	return &KubectlCmd{cmd: cmd}
}

// WithStdin sets what kubectl reads from its standard input.
func (k *KubectlCmd) WithStdin(r io.Reader) *KubectlCmd {
	k.cmd.Stdin = r
	return k
}

// Run runs kubectl and returns its combined output.
func (k *KubectlCmd) Run() (string, error) {
	var out bytes.Buffer
	k.cmd.Stdout, k.cmd.Stderr = &out, &out
	err := k.cmd.Run()
	return out.String(), err
}
