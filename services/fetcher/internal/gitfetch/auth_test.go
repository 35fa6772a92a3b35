package gitfetch

import (
	"net/url"
	"reflect"
	"testing"

	"github.com/go-git/go-git/v5/plumbing/transport"
	githttp "github.com/go-git/go-git/v5/plumbing/transport/http"
)

func TestCredentialsFor(t *testing.T) {
	cases := []struct {
		name   string
		url    string
		data   map[string]string
		method transport.AuthMethod
		ca     string
		err    string
	}{
		{name: "no secret", url: "https://example.com/r.git"},
		{name: "basic auth", url: "https://example.com/r.git", data: map[string]string{"username": "u", "password": "p"},
			method: &githttp.BasicAuth{Username: "u", Password: "p"}},
		{name: "bearer token wins over basic auth keys", url: "https://example.com/r.git",
			data: map[string]string{"bearerToken": "tok", "username": "u", "password": "p"}, method: &githttp.TokenAuth{Token: "tok"}},
		{name: "ca.crt over caFile", url: "https://example.com/r.git", data: map[string]string{"ca.crt": "A", "caFile": "B"}, ca: "A"},
		{name: "caFile", url: "https://example.com/r.git", data: map[string]string{"caFile": "B", "username": "u"}, ca: "B",
			method: &githttp.BasicAuth{Username: "u"}},
		{name: "user-info of the URL", url: "https://u:p@example.com/r.git", method: &githttp.BasicAuth{Username: "u", Password: "p"}},
		{name: "secret over user-info", url: "https://x:y@example.com/r.git", data: map[string]string{"username": "u", "password": "p"},
			method: &githttp.BasicAuth{Username: "u", Password: "p"}},
		{name: "password without username", url: "https://example.com/r.git", data: map[string]string{"password": "p"},
			err: "invalid 'https' auth option: 'password' requires 'username' to be set"},
		{name: "token and user-info", url: "https://u:p@example.com/r.git", data: map[string]string{"bearerToken": "tok"},
			err: "basic auth and bearer token cannot be set at the same time"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			u, err := url.Parse(tc.url)
			if err != nil {
				t.Fatal(err)
			}
			var data map[string][]byte
			if tc.data != nil {
				data = map[string][]byte{}
				for k, v := range tc.data {
					data[k] = []byte(v)
				}
			}
			c, err := credentialsFor(u, data)
			if tc.err != "" {
				if err == nil || err.Error() != tc.err {
					t.Fatalf("error = %v, want %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(c.method, tc.method) || string(c.ca) != tc.ca {
				t.Errorf("credentials = %#v, ca %q; want %#v, ca %q", c.method, c.ca, tc.method, tc.ca)
			}
		})
	}
}
