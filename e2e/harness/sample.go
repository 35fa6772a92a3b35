package harness

import (
	"embed"
	"fmt"
	"io/fs"
)

//go:embed sample
var sample embed.FS

// SampleFiles returns the sample repository `make run` serves and the
// walkthrough test uses: a small podinfo-like tree (README and kustomize
// manifests), as path -> content.
func SampleFiles() (map[string]string, error) {
	root, err := fs.Sub(sample, "sample")
	if err != nil {
		return nil, fmt.Errorf("sample: %w", err)
	}
	files := map[string]string{}
	err = fs.WalkDir(root, ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := fs.ReadFile(root, p)
		if err != nil {
			return err
		}
		files[p] = string(b)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("sample: %w", err)
	}
	return files, nil
}
