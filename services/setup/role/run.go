package role

import (
	"context"
	"fmt"
	"io"

	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/yaml"

	"github.com/headwater-gitops/headwater/services/setup/internal/secrets"
)

// ensure creates the missing Secrets in the cluster and reports each
// change on out.
func ensure(ctx context.Context, o *options, out io.Writer) error {
	cfg, err := o.kube.Load()
	if err != nil {
		return err
	}
	cfg.UserAgent = "headwater-setup"
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return fmt.Errorf("kubernetes client: %w", err)
	}
	actions, err := secrets.Ensure(ctx, client.CoreV1(), o.spec())
	for _, a := range actions {
		fmt.Fprintf(out, "%s Secret %s/%s\n", a.Verb, o.namespace, a.Secret)
	}
	if err != nil {
		return err
	}
	if len(actions) == 0 {
		fmt.Fprintf(out, "every Secret is in place in namespace %s\n", o.namespace)
	}
	return nil
}

// printSecrets writes a fresh set of the Secrets to out as YAML documents, their
// values in stringData so that they read (and encrypt) as text.
func printSecrets(o *options, out io.Writer) error {
	list, err := secrets.Generate(o.spec())
	if err != nil {
		return err
	}
	for i, s := range list {
		s.StringData = map[string]string{}
		for k, v := range s.Data {
			s.StringData[k] = string(v)
		}
		s.Data = nil
		b, err := yaml.Marshal(s)
		if err != nil {
			return fmt.Errorf("secret %s: %w", s.Name, err)
		}
		if i > 0 {
			if _, err := io.WriteString(out, "---\n"); err != nil {
				return err
			}
		}
		if _, err := out.Write(b); err != nil {
			return err
		}
	}
	return nil
}
