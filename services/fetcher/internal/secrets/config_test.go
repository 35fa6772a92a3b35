package secrets

import "testing"

func TestProxyURL(t *testing.T) {
	cases := []struct {
		data    map[string]string
		want    string
		message string
	}{
		{data: map[string]string{"address": "http://proxy:3128"}, want: "http://proxy:3128"},
		{data: map[string]string{"address": "https://proxy:3128", "username": "u"}, want: "https://u@proxy:3128"},
		{data: map[string]string{"address": "socks5://proxy:1080", "username": "u", "password": "p"}, want: "socks5://u:p@proxy:1080"},
		{data: map[string]string{"address": ""}, message: "secret 'ns/p': proxy address is empty"},
		// The address may hold a password: it is not quoted.
		{data: map[string]string{"address": "http://u:s3cr3t@proxy:port"}, message: "secret 'ns/p': failed to parse proxy address"},
	}
	for _, tc := range cases {
		data := map[string][]byte{}
		for k, v := range tc.data {
			data[k] = []byte(v)
		}
		u, err := ProxyURL(data, "ns/p")
		switch {
		case tc.message != "":
			if err == nil || err.Error() != tc.message {
				t.Errorf("ProxyURL(%v) error = %v, want %q", tc.data, err, tc.message)
			}
		case err != nil || u.String() != tc.want:
			t.Errorf("ProxyURL(%v) = %v, %v; want %s", tc.data, u, err, tc.want)
		}
	}
}
