package miniotest

import (
	"net/http"
	"testing"
	"time"

	"github.com/minio/minio-go/v7/pkg/credentials"
)

// AssumeRole mints temporary credentials of the root user at the server's
// own STS (AssumeRole): what a test STS hands out as the credentials of
// another identity, which the server then accepts.
func (s *Server) AssumeRole() (credentials.Value, error) {
	c, err := credentials.NewSTSAssumeRole(s.URL(), credentials.STSAssumeRoleOptions{AccessKey: s.AccessKey, SecretKey: s.SecretKey})
	if err != nil {
		return credentials.Value{}, err
	}
	return c.GetWithContext(&credentials.CredContext{Client: http.DefaultClient})
}

// WaitIAM waits until the server's IAM has started, failing the test
// after readyTimeout. MinIO serves objects before it has: until then its
// STS answers "Server not initialized" or "IAM sub-system is being
// initialized", so a test of an STS exchange waits for it first, and
// what it tests is the exchange, not MinIO's start.
func (s *Server) WaitIAM(tb testing.TB) {
	tb.Helper()
	deadline := time.Now().Add(readyTimeout)
	for {
		_, err := s.AssumeRole()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			tb.Fatalf("miniotest: the IAM of the server at %s did not start within %s: %v", s.Endpoint, readyTimeout, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
