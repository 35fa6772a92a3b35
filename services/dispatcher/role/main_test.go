package role

import (
	"context"
	"flag"
	"io"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/testr"

	"github.com/headwater-gitops/headwater/pkg/command"
)

func TestFlagDefaults(t *testing.T) {
	fs := flag.NewFlagSet(service, flag.ContinueOnError)
	var o options
	o.bindFlags(fs)
	t.Setenv("HEADWATER_REPORT_INTERVAL", "500ms")
	if err := command.ParseArgs(fs, []string{"-concurrency=3"}, io.Discard); err != nil {
		t.Fatal(err)
	}
	if o.telemetry.Addr != ":9104" || o.concurrency != 3 || o.reportInterval != 500*time.Millisecond || o.kube.QPS != -1 {
		t.Errorf("options = %+v", o)
	}
}

func TestRunRejectsBadOptions(t *testing.T) {
	for _, args := range [][]string{
		{"-concurrency=0"},
		{"-report-interval=0s"},
	} {
		fs := flag.NewFlagSet(service, flag.ContinueOnError)
		var o options
		o.bindFlags(fs)
		if err := fs.Parse(args); err != nil {
			t.Fatal(err)
		}
		if err := run(logr.NewContext(context.Background(), testr.New(t)), o); err == nil {
			t.Errorf("run accepted %q", args)
		}
	}
}
