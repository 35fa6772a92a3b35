// Package flagenv lets every flag of a service be set from the environment,
// for container use: flag "nats-url" is read from HEADWATER_NATS_URL when it
// is not given on the command line.
package flagenv

import (
	"flag"
	"fmt"
	"os"
	"strings"
)

// Prefix is prepended to every environment variable name.
const Prefix = "HEADWATER_"

// EnvName is the environment variable that backs a flag.
func EnvName(flagName string) string {
	return Prefix + strings.ToUpper(strings.NewReplacer("-", "_", ".", "_").Replace(flagName))
}

// Parse parses args into fs, then sets every flag not given on the command
// line from its environment variable, if that is set (see FromEnv).
// Command-line flags win.
func Parse(fs *flag.FlagSet, args []string) error {
	if err := fs.Parse(args); err != nil {
		return err
	}
	return FromEnv(fs)
}

// Alias is implemented by the value of a flag that is another name of a
// flag (see package fluxflags): the alias is not read from the
// environment, and the flag is not when the command line gives the alias.
type Alias interface {
	// AliasOf names the flag this one is an alias of.
	AliasOf() string
}

// FromEnv sets every flag of the parsed fs that the command line did not
// give from its environment variable, if that is set. Flags named in
// commandLineOnly are never read from the environment, nor aliases (see
// Alias), whose flag is read under its own name.
func FromEnv(fs *flag.FlagSet, commandLineOnly ...string) error {
	given := map[string]bool{}
	fs.Visit(func(f *flag.Flag) {
		given[f.Name] = true
		if a, ok := f.Value.(Alias); ok {
			given[a.AliasOf()] = true
		}
	})
	for _, name := range commandLineOnly {
		given[name] = true
	}
	var err error
	fs.VisitAll(func(f *flag.Flag) {
		if _, alias := f.Value.(Alias); alias || given[f.Name] || err != nil {
			return
		}
		if v, ok := os.LookupEnv(EnvName(f.Name)); ok {
			if serr := fs.Set(f.Name, v); serr != nil {
				err = fmt.Errorf("environment %s: %w", EnvName(f.Name), serr)
			}
		}
	})
	return err
}
