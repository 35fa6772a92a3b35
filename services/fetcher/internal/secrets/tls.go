package secrets

// HasTLS reports whether data holds any TLS key, standard or deprecated
// (a HelmRepository's secretRef may carry TLS material besides basic
// auth, which Flux still reads).
func HasTLS(data map[string][]byte) bool {
	for _, k := range []string{keyCA, keyCert, keyKey, keyCAFile, keyCertFile, keyKeyFile} {
		if _, ok := data[k]; ok {
			return true
		}
	}
	return false
}
