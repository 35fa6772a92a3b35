package packager

import (
	"flag"
	"strings"
	"testing"
)

func TestOptionsCompressionLevel(t *testing.T) {
	tests := []struct {
		args    []string
		want    int
		wantErr string
	}{
		{nil, 1, ""},
		{[]string{"-compression-level=9"}, 9, ""},
		{[]string{"-compression-level=0"}, 0, ""},
		{[]string{"-compression-level=10"}, 10, "--compression-level must be from 1 to 9"},
		{[]string{"-compression-level=-2"}, -2, "--compression-level must be from 1 to 9"},
	}
	for _, tc := range tests {
		var o Options
		fs := flag.NewFlagSet("packager", flag.ContinueOnError)
		o.BindFlags(fs)
		if err := fs.Parse(tc.args); err != nil {
			t.Fatal(err)
		}
		if o.CompressionLevel != tc.want {
			t.Errorf("%v: level %d, want %d", tc.args, o.CompressionLevel, tc.want)
		}
		err := o.Validate()
		if (err == nil) != (tc.wantErr == "") || (err != nil && !strings.Contains(err.Error(), tc.wantErr)) {
			t.Errorf("%v: Validate() = %v, want %q", tc.args, err, tc.wantErr)
		}
	}
}
