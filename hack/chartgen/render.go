package main

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
)

// Object is one rendered resource.
type Object struct {
	Kind, Name string
	// Map is the resource as decoded from YAML.
	Map map[string]any
}

// Key identifies an object within one installation (everything of
// Headwater is in one namespace, or cluster-scoped).
func (o Object) Key() string { return o.Kind + "/" + o.Name }

// Renderer renders kustomizations over a copy of deploy/ in memory, where
// a kustomization of chartgen's own can sit beside it (kustomize takes no
// absolute paths, and deploy/ stays untouched).
type Renderer struct {
	fsys filesys.FileSystem
	k    *krusty.Kustomizer
}

// NewRenderer copies root/deploy into memory.
func NewRenderer(root string) (*Renderer, error) {
	fsys := filesys.MakeFsInMemory()
	deploy := filepath.Join(root, "deploy")
	err := filepath.WalkDir(deploy, func(p string, d fs.DirEntry, err error) error {
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
		return nil, fmt.Errorf("copy %s: %w", deploy, err)
	}
	return &Renderer{fsys: fsys, k: krusty.MakeKustomizer(krusty.MakeDefaultOptions())}, nil
}

// Render renders a kustomization (the text of its kustomization.yaml) that
// refers to deploy/ as ../deploy.
func (r *Renderer) Render(kustomization string) ([]Object, error) {
	if err := r.fsys.WriteFile("/chartgen/kustomization.yaml", []byte(kustomization)); err != nil {
		return nil, err
	}
	return r.RenderDir("/chartgen")
}

// RenderDir renders the kustomization in dir of the in-memory tree, where
// deploy/ is /deploy.
func (r *Renderer) RenderDir(dir string) ([]Object, error) {
	rm, err := r.k.Run(r.fsys, dir)
	if err != nil {
		return nil, fmt.Errorf("kustomize build: %w", err)
	}
	var objs []Object
	for _, res := range rm.Resources() {
		m, err := res.Map()
		if err != nil {
			return nil, fmt.Errorf("%s: %w", res.CurId(), err)
		}
		objs = append(objs, Object{Kind: res.GetKind(), Name: res.GetName(), Map: m})
	}
	return objs, nil
}

// WriteFile puts a file into the in-memory tree (a test's kustomization
// beside deploy/).
func (r *Renderer) WriteFile(path string, data []byte) error {
	return r.fsys.WriteFile(path, data)
}

// BuildYAML renders the kustomization in dir of the in-memory tree as
// `kustomize build` prints it.
func (r *Renderer) BuildYAML(dir string) ([]byte, error) {
	rm, err := r.k.Run(r.fsys, dir)
	if err != nil {
		return nil, fmt.Errorf("kustomize build: %w", err)
	}
	return rm.AsYaml()
}
