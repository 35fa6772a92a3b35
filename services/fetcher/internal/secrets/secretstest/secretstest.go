// Package secretstest gives tests a secrets.Reader over Secrets they
// declare, through controller-runtime's fake client (the fetcher only
// gets Secrets by name; there is no API behaviour to exercise).
package secretstest

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/headwater-gitops/headwater/services/fetcher/internal/secrets"
)

// Reader returns a Reader over the Secrets data (name -> key -> value) in
// namespace.
func Reader(t testing.TB, namespace string, data map[string]map[string]string) secrets.Reader {
	t.Helper()
	scheme := runtime.NewScheme()
	if err := corev1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	b := fake.NewClientBuilder().WithScheme(scheme)
	for name, kv := range data {
		s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name}, Data: map[string][]byte{}}
		for k, v := range kv {
			s.Data[k] = []byte(v)
		}
		b = b.WithObjects(s)
	}
	return secrets.NewKube(b.Build())
}
