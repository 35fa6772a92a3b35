package deployvalidate

import (
	"fmt"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
)

// modulePrefix is the import path prefix of every package in the repository.
const modulePrefix = "github.com/headwater-gitops/headwater/"

// EnvPrefix is prepended to every flag's environment variable.
const EnvPrefix = "HEADWATER_"

// EnvName is the environment variable that backs a flag, exactly as
// pkg/flagenv.EnvName derives it: HEADWATER_ + the name in upper case with
// "-" and "." turned into "_".
func EnvName(flagName string) string {
	return EnvPrefix + strings.ToUpper(strings.NewReplacer("-", "_", ".", "_").Replace(flagName))
}

// Flag is one flag a service registers.
type Flag struct {
	// Name is the flag's name, without dashes.
	Name string
	// Bool is set for flags that take no value on the command line.
	Bool bool
	// File is where the flag is registered, relative to the repository.
	File string
}

// FlagSet is the set of flags a service registers, by name.
type FlagSet map[string]Flag

// ByEnv returns the flag whose environment variable is env.
func (s FlagSet) ByEnv(env string) (Flag, bool) {
	for _, f := range s {
		if EnvName(f.Name) == env {
			return f, true
		}
	}
	return Flag{}, false
}

// Names returns the flag names, sorted.
func (s FlagSet) Names() []string {
	names := make([]string, 0, len(s))
	for n := range s {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

var (
	// varFlag matches fs.StringVar(&o.x, "name", ...), fs.Var(v, "name", ...)
	// and the other <Type>Var methods of flag.FlagSet.
	varFlag = regexp.MustCompile(`\.(String|Int|Int64|Uint|Uint64|Bool|Duration|Float64|Text)?Var\(\s*[^,()"]+,\s*"([^"]+)"`)
	// valueFlag matches fs.String("name", ...), fs.Func("name", ...) and the
	// other methods that return a flag's value or take a function.
	valueFlag = regexp.MustCompile(`\.(String|Int|Int64|Uint|Uint64|Bool|Duration|Float64|Func|BoolFunc)\(\s*"([^"]+)"`)
	// flagName is what a real flag name looks like; anything else a
	// pattern matched is not a flag registration.
	flagName = regexp.MustCompile(`^[a-z0-9][a-z0-9.-]*$`)
)

// ParseFlags returns the flags registered in Go source text src, found with
// regular expressions over flag.FlagSet's registration methods. file names
// the source in the result. Names must be string literals.
func ParseFlags(file, src string) FlagSet {
	out := FlagSet{}
	for _, re := range []*regexp.Regexp{varFlag, valueFlag} {
		for _, m := range re.FindAllStringSubmatch(src, -1) {
			typ, name := m[1], m[2]
			if !flagName.MatchString(name) {
				continue
			}
			out[name] = Flag{Name: name, Bool: typ == "Bool" || typ == "BoolFunc", File: file}
		}
	}
	return out
}

// ServiceFlags returns the flags service registers: those in the
// non-test Go files of services/<service>/role (what its main package and
// headwater -target=<service> run) and in every repository package that
// package imports directly (pkg/bus, pkg/storage,
// services/<service>/internal/..., ...), and in the platform packages
// (pkg/...) those reach in turn (a plug-in kind's fetcher binds its flags
// through pkg/sourcekit). A service's own packages imported only
// indirectly are not read: flags are bound from main through option
// structs, as the house style asks.
func ServiceFlags(root, service string) (FlagSet, error) {
	mainDir := filepath.Join(root, "services", service, "role")
	dirs := []string{mainDir}
	files, err := goFiles(mainDir)
	if err != nil {
		return nil, err
	}
	if len(files) == 0 {
		return nil, fmt.Errorf("service %s: no Go files in %s", service, mainDir)
	}
	// The role's imports of the module, and, transitively, what the
	// platform packages (pkg/...) it reaches import: a plug-in kind's role
	// binds its flags through pkg/sourcekit, which binds pkg/bus's and
	// pkg/storage's.
	fset := token.NewFileSet()
	for i := 0; i < len(dirs); i++ {
		dir := dirs[i]
		if i > 0 && !strings.HasPrefix(dir, filepath.Join(root, "pkg")+string(filepath.Separator)) {
			continue
		}
		files := files
		if i > 0 {
			if files, err = goFiles(dir); err != nil {
				return nil, err
			}
		}
		for _, f := range files {
			parsed, err := parser.ParseFile(fset, f, nil, parser.ImportsOnly)
			if err != nil {
				return nil, fmt.Errorf("service %s: %w", service, err)
			}
			for _, imp := range parsed.Imports {
				path, err := strconv.Unquote(imp.Path.Value)
				if err != nil {
					return nil, fmt.Errorf("service %s: import %s: %w", service, imp.Path.Value, err)
				}
				rel, ok := strings.CutPrefix(path, modulePrefix)
				if !ok {
					continue
				}
				d := filepath.Join(root, filepath.FromSlash(rel))
				if !slices.Contains(dirs, d) {
					dirs = append(dirs, d)
				}
			}
		}
	}
	out := FlagSet{}
	for _, dir := range dirs {
		files, err := goFiles(dir)
		if err != nil {
			return nil, err
		}
		for _, f := range files {
			src, err := os.ReadFile(f)
			if err != nil {
				return nil, fmt.Errorf("service %s: %w", service, err)
			}
			rel, err := filepath.Rel(root, f)
			if err != nil {
				return nil, fmt.Errorf("service %s: %w", service, err)
			}
			for name, fl := range ParseFlags(filepath.ToSlash(rel), string(src)) {
				out[name] = fl
			}
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("service %s: no flags found", service)
	}
	return out, nil
}

// AllServiceFlags returns ServiceFlags for every one of Services,
// OptionalServices and Commands.
func AllServiceFlags(root string) (map[string]FlagSet, error) {
	out := map[string]FlagSet{}
	for _, s := range slices.Concat(Services, OptionalServices, Commands) {
		fs, err := ServiceFlags(root, s)
		if err != nil {
			return nil, err
		}
		out[s] = fs
	}
	return out, nil
}

// goFiles lists the non-test Go files of dir (not its subdirectories).
func goFiles(dir string) ([]string, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", dir, err)
	}
	var out []string
	for _, e := range entries {
		n := e.Name()
		if e.IsDir() || !strings.HasSuffix(n, ".go") || strings.HasSuffix(n, "_test.go") {
			continue
		}
		out = append(out, filepath.Join(dir, n))
	}
	return out, nil
}

// CheckEnv reports every HEADWATER_* variable among names that is not the
// environment variable of one of flags.
func CheckEnv(service string, flags FlagSet, names []string) []string {
	var problems []string
	for _, n := range names {
		if !strings.HasPrefix(n, EnvPrefix) {
			continue
		}
		if _, ok := flags.ByEnv(n); !ok {
			problems = append(problems, fmt.Sprintf("%s: environment variable %s matches no flag (flags: %s)",
				service, n, strings.Join(flags.Names(), ", ")))
		}
	}
	return problems
}

// CheckArgs reports every command-line argument in args that the service's
// flag.FlagSet would reject: an unknown flag, a non-boolean flag without a
// value, or a positional argument (no Headwater service takes any).
func CheckArgs(service string, flags FlagSet, args []string) []string {
	var problems []string
	for i := 0; i < len(args); i++ {
		a := args[i]
		if a == "--" || !strings.HasPrefix(a, "-") || a == "-" {
			problems = append(problems, fmt.Sprintf("%s: argument %q is not a flag (services take no positional arguments)", service, a))
			continue
		}
		name, _, hasValue := strings.Cut(strings.TrimPrefix(strings.TrimPrefix(a, "-"), "-"), "=")
		f, ok := flags[name]
		if !ok {
			problems = append(problems, fmt.Sprintf("%s: argument %q names no flag", service, a))
			continue
		}
		if hasValue || f.Bool {
			continue
		}
		if i+1 >= len(args) {
			problems = append(problems, fmt.Sprintf("%s: flag %q needs a value", service, a))
			continue
		}
		i++ // the value
	}
	return problems
}

// TargetArgs splits a Headwater container's arguments: the first must be
// -target=<service> (the one image runs the service it names), and the rest
// are the service's own. ok is false, and rest all of args, when args do
// not start so.
func TargetArgs(service string, args []string) (rest []string, ok bool) {
	if len(args) == 0 || args[0] != "-target="+service {
		return args, false
	}
	return args[1:], true
}

// ArgValue returns the value args give flag name, if any: the last of
// -name=v, --name=v, -name v and --name v.
func ArgValue(args []string, name string) (string, bool) {
	var val string
	var found bool
	for i := 0; i < len(args); i++ {
		a := strings.TrimPrefix(strings.TrimPrefix(args[i], "-"), "-")
		n, v, hasValue := strings.Cut(a, "=")
		if n != name || !strings.HasPrefix(args[i], "-") {
			continue
		}
		switch {
		case hasValue:
			val, found = v, true
		case i+1 < len(args):
			val, found = args[i+1], true
			i++
		}
	}
	return val, found
}
