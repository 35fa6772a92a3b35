package receiver

import (
	"fmt"

	"k8s.io/apimachinery/pkg/api/meta"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// forEach calls fn for every item of a typed list.
func forEach(list client.ObjectList, fn func(client.Object)) error {
	items, err := meta.ExtractList(list)
	if err != nil {
		return fmt.Errorf("list items: %w", err)
	}
	for _, item := range items {
		o, ok := item.(client.Object)
		if !ok {
			return fmt.Errorf("list item %T is not an object", item)
		}
		fn(o)
	}
	return nil
}
