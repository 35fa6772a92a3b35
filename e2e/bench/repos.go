package bench

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/headwater-gitops/headwater/e2e/harness"
)

// Sizes of the scenarios' repositories; changing one changes what the
// numbers mean, so bigTreeVersion names the generated big tree.
const (
	// smallRepoFiles files of smallFileSize bytes make a ~20 KiB tree.
	smallRepoFiles = 10
	smallFileSize  = 2 << 10

	// The big tree: bigBinaryFiles files of 1 MiB of random bytes and
	// bigTextFiles text files of 4 KiB, 256 MiB in all.
	bigBinaryFiles = 255
	bigBinarySize  = 1 << 20
	bigTextFiles   = 256
	bigTextSize    = 4 << 10
	bigTreeSize    = bigBinaryFiles*bigBinarySize + bigTextFiles*bigTextSize
	bigTreeVersion = "v1-256MiB"
)

// words make the text files look like text (and compress like it).
var words = strings.Fields(`apiVersion kind metadata name namespace spec
replicas selector matchLabels template containers image ports containerPort
resources limits requests memory cpu env value volumeMounts mountPath labels
app tier frontend backend service deployment configmap secret ingress`)

// text returns size bytes of deterministic word salad.
func text(rnd *rand.Rand, size int) string {
	var b strings.Builder
	b.Grow(size + 16)
	for b.Len() < size {
		b.WriteString(words[rnd.IntN(len(words))])
		if rnd.IntN(8) == 0 {
			b.WriteString(":\n  ")
		} else {
			b.WriteByte(' ')
		}
	}
	return b.String()[:size]
}

// smallReposVersion names the generated small repositories: change it
// with anything that changes their content.
const smallReposVersion = "v1"

// smallRepoName is the name of the i-th small repository.
func smallRepoName(i int) string { return fmt.Sprintf("small-%04d", i) }

// linkSmallRepos serves the first n small repositories from env's git
// server (as links to bare repositories generated once under the system
// temporary directory and reused by later runs) and returns their URLs.
// Each holds a ~20 KiB tree in one commit on branch master, distinct from
// every other's.
func linkSmallRepos(env *harness.Env, n int, progress func(string)) ([]string, error) {
	dir := filepath.Join(os.TempDir(), "headwater-bench", "small-repos-"+smallReposVersion)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("small repositories: %w", err)
	}
	urls := make([]string, n)
	generated := 0
	for i := range n {
		name := smallRepoName(i)
		bare := filepath.Join(dir, name+".git")
		if _, err := os.Stat(bare); errors.Is(err, os.ErrNotExist) {
			if generated == 0 && progress != nil {
				progress(fmt.Sprintf("generating small repositories once, cached in %s", dir))
			}
			if err := generateSmallRepo(bare, name, uint64(i)); err != nil {
				return nil, err
			}
			generated++
		} else if err != nil {
			return nil, fmt.Errorf("small repositories: %w", err)
		}
		if err := os.Symlink(bare, filepath.Join(env.GitRoot, name+".git")); err != nil {
			return nil, fmt.Errorf("serve %s: %w", name, err)
		}
		urls[i] = env.Git.RepoURL(name)
	}
	return urls, nil
}

// generateSmallRepo writes the bare repository final with git fast-import
// (two git processes, no work tree), atomically.
func generateSmallRepo(final, name string, seed uint64) error {
	tmp := final + ".tmp"
	_ = os.RemoveAll(tmp)
	defer os.RemoveAll(tmp) // a no-op once renamed
	if err := gitCmd(nil, "init", "--quiet", "--bare", "--initial-branch="+branch, tmp); err != nil {
		return err
	}
	rnd := rand.New(rand.NewPCG(seed, 1))
	files := []struct{ path, content string }{{"README.md", "# " + name + "\n\nA small repository for the benchmark.\n"}}
	for i := range smallRepoFiles - 1 {
		files = append(files, struct{ path, content string }{fmt.Sprintf("deploy/manifest-%02d.yaml", i), text(rnd, smallFileSize)})
	}
	var b bytes.Buffer
	msg := "Initial commit of " + name + "\n"
	fmt.Fprintf(&b, "commit refs/heads/%s\ncommitter Headwater <headwater@example.com> 1700000000 +0000\ndata %d\n%s", branch, len(msg), msg)
	for _, f := range files {
		fmt.Fprintf(&b, "M 100644 inline %s\ndata %d\n%s\n", f.path, len(f.content), f.content)
	}
	b.WriteString("\n")
	if err := gitCmd(&b, "--git-dir", tmp, "fast-import", "--quiet"); err != nil {
		return fmt.Errorf("repository %s: %w", name, err)
	}
	if err := os.Rename(tmp, final); err != nil {
		return fmt.Errorf("repository %s: %w", name, err)
	}
	return nil
}

// bigTreeRepo returns the bare repository holding the 256 MiB tree on
// branch master, generating it on first use under the system temporary
// directory (keyed by bigTreeVersion) so later runs reuse it.
func bigTreeRepo(progress func(string)) (string, error) {
	parent := filepath.Join(os.TempDir(), "headwater-bench")
	final := filepath.Join(parent, "big-tree-"+bigTreeVersion+".git")
	if fi, err := os.Stat(final); err == nil && fi.IsDir() {
		return final, nil
	}
	if err := os.MkdirAll(parent, 0o755); err != nil {
		return "", fmt.Errorf("big tree cache: %w", err)
	}
	tmp, err := os.MkdirTemp(parent, ".big-tree-*")
	if err != nil {
		return "", fmt.Errorf("big tree cache: %w", err)
	}
	defer os.RemoveAll(tmp) // a no-op once renamed
	progress(fmt.Sprintf("generating the %d MiB repository once, cached in %s", bigTreeSize>>20, final))
	if err := gitCmd(nil, "init", "--quiet", "--bare", "--initial-branch=master", tmp); err != nil {
		return "", err
	}
	pr, pw := io.Pipe()
	go func() { pw.CloseWithError(writeBigTree(pw)) }()
	if err := gitCmd(pr, "--git-dir", tmp, "fast-import", "--quiet"); err != nil {
		return "", err
	}
	if err := os.Rename(tmp, final); err != nil {
		return "", fmt.Errorf("big tree cache: %w", err)
	}
	return final, nil
}

// writeBigTree writes a git fast-import stream of one commit on master
// holding the big tree.
func writeBigTree(w io.Writer) error {
	bw := bufio.NewWriterSize(w, 1<<20)
	rnd := rand.New(rand.NewChaCha8([32]byte{'h', 'e', 'a', 'd', 'w', 'a', 't', 'e', 'r'}))
	var paths []string
	mark := 0
	blob := func(path string, data []byte) {
		mark++
		fmt.Fprintf(bw, "blob\nmark :%d\ndata %d\n", mark, len(data))
		bw.Write(data)
		bw.WriteByte('\n')
		paths = append(paths, path)
	}
	buf := make([]byte, bigBinarySize)
	for i := range bigBinaryFiles {
		for j := 0; j < len(buf); j += 8 {
			v := rnd.Uint64()
			for k := range 8 {
				buf[j+k] = byte(v >> (8 * k))
			}
		}
		blob(fmt.Sprintf("data/blob-%03d.bin", i), buf)
	}
	for i := range bigTextFiles {
		blob(fmt.Sprintf("docs/page-%03d.md", i), []byte(text(rnd, bigTextSize)))
	}
	msg := "Add a 256 MiB tree\n"
	fmt.Fprintf(bw, "commit refs/heads/master\ncommitter Headwater <headwater@example.com> 1700000000 +0000\ndata %d\n%s", len(msg), msg)
	for i, p := range paths {
		fmt.Fprintf(bw, "M 100644 :%d %s\n", i+1, p)
	}
	bw.WriteString("\n")
	return bw.Flush()
}

// gitCmd runs the system git without user or system configuration.
func gitCmd(stdin io.Reader, args ...string) error {
	cmd := exec.Command("git", args...)
	cmd.Env = append(os.Environ(), "GIT_CONFIG_NOSYSTEM=1", "GIT_CONFIG_GLOBAL=/dev/null")
	cmd.Stdin = stdin
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return fmt.Errorf("git %s: %w: %s", strings.Join(args, " "), err, bytes.TrimSpace(stderr.Bytes()))
		}
		return fmt.Errorf("git %s: %w", strings.Join(args, " "), err)
	}
	return nil
}
