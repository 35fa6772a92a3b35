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

// createSmallRepo creates the served repository name with a ~20 KiB tree
// in one commit on branch.
func createSmallRepo(env *harness.Env, name, branch string, seed uint64) error {
	repo, err := env.NewRepo(name, branch)
	if err != nil {
		return err
	}
	rnd := rand.New(rand.NewPCG(seed, 1))
	files := map[string]string{"README.md": "# " + name + "\n\nA small repository for the benchmark.\n"}
	for i := range smallRepoFiles - 1 {
		files[fmt.Sprintf("deploy/manifest-%02d.yaml", i)] = text(rnd, smallFileSize)
	}
	if err := repo.Write(files); err != nil {
		return fmt.Errorf("repository %s: %w", name, err)
	}
	if _, err := repo.Commit("Initial commit of " + name); err != nil {
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
