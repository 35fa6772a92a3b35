package sourcekind

import (
	"context"
	"encoding/json"
	"fmt"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// PluginClient wraps a client so that the watcher's generic code reads and
// writes PluginObjects as it does Flux's typed objects: the API server and
// the informer cache hold a plug-in kind's objects as unstructured ones
// (no Go type is registered for them), and the client converts them to and
// from PluginObject on Get and Patch. Every other object passes through.
// Writes are patches (the watcher makes no others to sources), computed
// from the PluginObjects before and after, and applied to the unstructured
// object: fields the watcher does not know are left as they are.
func PluginClient(c client.Client) client.Client { return &pluginClient{Client: c} }

// PluginReader wraps a reader as PluginClient does, for the live reads.
func PluginReader(r client.Reader) client.Reader { return &pluginReader{Reader: r} }

type pluginClient struct {
	client.Client
}

type pluginReader struct {
	client.Reader
}

func (r *pluginReader) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	return getPlugin(ctx, r.Reader, key, obj, opts...)
}

func (c *pluginClient) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	return getPlugin(ctx, c.Client, key, obj, opts...)
}

func (c *pluginClient) Patch(ctx context.Context, obj client.Object, patch client.Patch, opts ...client.PatchOption) error {
	p, ok := obj.(*PluginObject)
	if !ok {
		return c.Client.Patch(ctx, obj, patch, opts...)
	}
	u, raw, err := pluginPatch(p, patch)
	if err != nil {
		return err
	}
	if err := c.Client.Patch(ctx, u, raw, opts...); err != nil {
		return err
	}
	return p.load(u)
}

func (c *pluginClient) Status() client.SubResourceWriter {
	return &pluginStatusWriter{SubResourceWriter: c.Client.Status()}
}

type pluginStatusWriter struct {
	client.SubResourceWriter
}

func (w *pluginStatusWriter) Patch(ctx context.Context, obj client.Object, patch client.Patch, opts ...client.SubResourcePatchOption) error {
	p, ok := obj.(*PluginObject)
	if !ok {
		return w.SubResourceWriter.Patch(ctx, obj, patch, opts...)
	}
	u, raw, err := pluginPatch(p, patch)
	if err != nil {
		return err
	}
	if err := w.SubResourceWriter.Patch(ctx, u, raw, opts...); err != nil {
		return err
	}
	return p.load(u)
}

// getPlugin reads a PluginObject through its unstructured form, and any
// other object as it is.
func getPlugin(ctx context.Context, r client.Reader, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	p, ok := obj.(*PluginObject)
	if !ok {
		return r.Get(ctx, key, obj, opts...)
	}
	u := &unstructured.Unstructured{}
	u.SetGroupVersionKind(p.GroupVersionKind())
	if err := r.Get(ctx, key, u, opts...); err != nil {
		return err
	}
	return p.load(u)
}

// pluginPatch computes patch's data for p (a merge patch of what changed,
// with p's resourceVersion when the patch asks for optimistic locking) and
// returns the unstructured object to apply it to with the data as a raw
// patch.
func pluginPatch(p *PluginObject, patch client.Patch) (*unstructured.Unstructured, client.Patch, error) {
	data, err := patch.Data(p)
	if err != nil {
		return nil, nil, fmt.Errorf("patch %s %s/%s: %w", p.Kind, p.Namespace, p.Name, err)
	}
	u := &unstructured.Unstructured{}
	u.SetGroupVersionKind(p.GroupVersionKind())
	u.SetNamespace(p.Namespace)
	u.SetName(p.Name)
	return u, client.RawPatch(patch.Type(), data), nil
}

// load replaces p with what u holds, keeping p's kind.
func (p *PluginObject) load(u *unstructured.Unstructured) error {
	b, err := json.Marshal(u.Object)
	if err != nil {
		return fmt.Errorf("read %s %s/%s: %w", u.GetKind(), u.GetNamespace(), u.GetName(), err)
	}
	gvk, field := p.GroupVersionKind(), p.IntervalField
	*p = PluginObject{}
	if err := json.Unmarshal(b, p); err != nil {
		return fmt.Errorf("read %s %s/%s: %w", u.GetKind(), u.GetNamespace(), u.GetName(), err)
	}
	p.SetGroupVersionKind(gvk)
	p.IntervalField = field
	return nil
}
