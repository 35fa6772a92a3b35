// Command headwater is every Headwater service in one binary, so that one
// image serves every Deployment: -target (HEADWATER_TARGET) names the role
// the process plays, and the other arguments are that role's flags,
// unchanged:
//
//	headwater -target=fetcher -concurrency=8
//
// Each role is still its own Deployment, with its own bus identity,
// service account and rights; what the roles share is the file their
// processes map, so a node holds its pages once. Run under the name of a
// role (a link named fetcher), the binary plays that role, as the
// separate service binaries do.
package main

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/headwater-gitops/headwater/pkg/buildinfo"
	artifactserver "github.com/headwater-gitops/headwater/services/artifact-server/role"
	dispatcher "github.com/headwater-gitops/headwater/services/dispatcher/role"
	fetcher "github.com/headwater-gitops/headwater/services/fetcher/role"
	httpsourcefetcher "github.com/headwater-gitops/headwater/services/httpsource-fetcher/role"
	packager "github.com/headwater-gitops/headwater/services/packager/role"
	receiver "github.com/headwater-gitops/headwater/services/receiver/role"
	setup "github.com/headwater-gitops/headwater/services/setup/role"
	watcher "github.com/headwater-gitops/headwater/services/watcher/role"
)

// targetEnv names the role when no -target flag does.
const targetEnv = "HEADWATER_TARGET"

// roles maps each -target to the role's main, which parses its own flags.
var roles = map[string]func(args []string){
	"artifact-server": artifactserver.Main,
	"dispatcher":      dispatcher.Main,
	"fetcher":         fetcher.Main,
	// The plug-in source kind shipped as the example (HTTPSource).
	"httpsource-fetcher": httpsourcefetcher.Main,
	"packager":           packager.Main,
	"receiver":           receiver.Main,
	"setup":              setup.Main,
	"watcher":            watcher.Main,
}

func main() {
	target, args, err := splitTarget(filepath.Base(os.Args[0]), os.Args[1:], os.Getenv(targetEnv))
	if err == nil && target == "" {
		os.Exit(noTarget(args, os.Stdout, os.Stderr))
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "headwater:", err)
		usage(os.Stderr)
		os.Exit(2)
	}
	roles[target](args)
}

// splitTarget finds the role to play and the arguments left for it: the
// program's name when it is a role's, else the first -target or --target
// flag (=value or a separate value) among args, else env. It is an error
// to name an unknown role; an empty target means none was named.
func splitTarget(program string, args []string, env string) (string, []string, error) {
	if _, ok := roles[program]; ok {
		return program, args, nil
	}
	target, rest, found := "", make([]string, 0, len(args)), false
	for i := 0; i < len(args); i++ {
		a := args[i]
		if a == "--" {
			rest = append(rest, args[i:]...)
			break
		}
		name, value, hasValue := strings.Cut(strings.TrimPrefix(strings.TrimPrefix(a, "-"), "-"), "=")
		if found || !strings.HasPrefix(a, "-") || name != "target" {
			rest = append(rest, a)
			continue
		}
		if !hasValue {
			if i+1 == len(args) {
				return "", nil, fmt.Errorf("flag needs an argument: -target")
			}
			i++
			value = args[i]
		}
		target, found = value, true
	}
	if !found {
		target = env
	}
	if _, ok := roles[target]; !ok && target != "" {
		return "", nil, fmt.Errorf("unknown -target %q", target)
	}
	return target, rest, nil
}

// noTarget answers a command line that names no role: -version prints the
// build, -help and -h the usage; anything else is an error (exit code 2).
func noTarget(args []string, stdout, stderr io.Writer) int {
	if len(args) == 1 {
		switch strings.TrimLeft(args[0], "-") {
		case "version":
			fmt.Fprintf(stdout, "headwater version %s\n", buildinfo.Get())
			return 0
		case "help", "h":
			usage(stdout)
			return 0
		}
	}
	fmt.Fprintln(stderr, "headwater: no -target (or "+targetEnv+") names a role")
	usage(stderr)
	return 2
}

// usage lists the roles.
func usage(w io.Writer) {
	names := make([]string, 0, len(roles))
	for name := range roles {
		names = append(names, name)
	}
	sort.Strings(names)
	fmt.Fprintf(w, "usage: headwater -target=<role> [role flags]\n  roles: %s\n  headwater -target=<role> -help lists a role's flags; headwater -version prints the build.\n",
		strings.Join(names, ", "))
}
