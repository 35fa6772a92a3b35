package deployvalidate

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"

	"github.com/compose-spec/compose-go/v2/cli"
	"github.com/compose-spec/compose-go/v2/types"
)

// ComposeFile is the compose file at the repository root.
const ComposeFile = "docker-compose.yaml"

// LoadCompose loads the repository's compose file as `docker compose` would
// from the repository root, with env (KEY=VALUE) as the only environment:
// interpolated, normalised, validated against the compose schema and with
// relative paths resolved.
func LoadCompose(ctx context.Context, root string, env []string) (*types.Project, error) {
	opts, err := cli.NewProjectOptions([]string{filepath.Join(root, ComposeFile)},
		cli.WithWorkingDirectory(root),
		cli.WithEnv(env),
		cli.WithInterpolation(true),
		cli.WithNormalization(true),
		cli.WithConsistency(true),
		cli.WithResolvedPaths(true),
	)
	if err != nil {
		return nil, fmt.Errorf("compose options: %w", err)
	}
	p, err := opts.LoadProject(ctx)
	if err != nil {
		return nil, fmt.Errorf("load %s: %w", ComposeFile, err)
	}
	return p, nil
}

// CheckComposeService checks that a compose service running a Headwater
// service picks it with -target (its command's first argument), sets only
// HEADWATER_* variables and arguments that name its flags, and does not
// replace the image's entrypoint.
func CheckComposeService(s types.ServiceConfig, service string, flags FlagSet) []string {
	var names []string
	for n := range s.Environment {
		names = append(names, n)
	}
	slices.Sort(names)
	problems := CheckEnv("compose "+s.Name, flags, names)
	args, ok := TargetArgs(service, s.Command)
	if !ok {
		problems = append(problems, fmt.Sprintf("compose %s: command %q does not start with -target=%s", s.Name, []string(s.Command), service))
	}
	problems = append(problems, CheckArgs("compose "+s.Name, flags, args)...)
	if len(s.Entrypoint) > 0 {
		problems = append(problems, fmt.Sprintf("compose %s: overrides the entrypoint with %v", s.Name, []string(s.Entrypoint)))
	}
	return problems
}

// ComposeFlagValue returns the value compose service s gives a flag: its
// command-line argument, which wins, else its HEADWATER_* variable.
func ComposeFlagValue(s types.ServiceConfig, flag string) (string, bool) {
	if v, ok := ArgValue(s.Command, flag); ok {
		return v, true
	}
	if v, ok := s.Environment[EnvName(flag)]; ok && v != nil {
		return *v, true
	}
	return "", false
}
