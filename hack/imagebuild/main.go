// Command imagebuild assembles Headwater's OCI images, and the third-party
// images its Kubernetes manifests name, from static binaries the Makefile has
// cross-compiled: no Docker, nothing pulled. The same binaries and
// -source-date-epoch give the same digests.
//
//	imagebuild -platforms linux/amd64,linux/arm64 -source-date-epoch N \
//	  -version V -revision R -registry ghcr.io/headwater-gitops -tag v0.1.0 \
//	  -service watcher=bin/{os}_{arch}/watcher ... \
//	  -third-party pause=registry.k8s.io/pause:3.10@bin/{os}_{arch}/pause ... \
//	  -layout bin/images/oci [-archive FILE] [-push host:port/path [-insecure]]
//
// It is run by `make images` and `make image-archive`. With -base-dir it
// only writes the images' base files, which the Dockerfile copies in.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/headwater-gitops/headwater/hack/imagebuild/internal/ociimage"
)

// options are imagebuild's flags.
type options struct {
	platforms  string
	epoch      string
	version    string
	revision   string
	registry   string
	tag        string
	services   listFlag
	thirdParty listFlag
	layout     string
	archive    string
	push       string
	insecure   bool
	sizes      bool
	baseDir    string
	digests    string
}

// listFlag is a repeatable string flag.
type listFlag []string

func (l *listFlag) String() string     { return strings.Join(*l, " ") }
func (l *listFlag) Set(s string) error { *l = append(*l, s); return nil }

func (o *options) bindFlags(fs *flag.FlagSet) {
	fs.StringVar(&o.platforms, "platforms", "linux/amd64,linux/arm64", "Comma-separated os/arch platforms of every image.")
	fs.StringVar(&o.epoch, "source-date-epoch", os.Getenv("SOURCE_DATE_EPOCH"), "Unix time of every file, the configs' created time and the created label (default $SOURCE_DATE_EPOCH).")
	fs.StringVar(&o.version, "version", "", "Version label of the Headwater images: the one stamped into the binaries.")
	fs.StringVar(&o.revision, "revision", "", "Revision label of the Headwater images: the commit stamped into the binaries.")
	fs.StringVar(&o.registry, "registry", "ghcr.io/headwater-gitops", "Registry and path the Headwater images are named under.")
	fs.StringVar(&o.tag, "tag", "", "Tag of the Headwater images.")
	fs.Var(&o.services, "service", "A Headwater image, as name=binary ({os} and {arch} in binary stand for the platform); repeatable.")
	fs.Var(&o.thirdParty, "third-party", "A third-party image, as kind=ref@binary, kind one of "+strings.Join(ociimage.ThirdPartyKinds(), ", ")+"; repeatable.")
	fs.StringVar(&o.layout, "layout", "", "Write every image into this OCI image layout directory (replaced).")
	fs.StringVar(&o.archive, "archive", "", "Write every image into this tar of an OCI image layout (for ctr images import).")
	fs.StringVar(&o.push, "push", "", "Push every image to this registry prefix (host[:port][/path]), as <prefix>/<name>:<tag>.")
	fs.BoolVar(&o.insecure, "insecure", false, "Allow plain HTTP when pushing (a local registry).")
	fs.BoolVar(&o.sizes, "sizes", true, "Print a Markdown table of the images' sizes.")
	fs.StringVar(&o.digests, "digests", "", "Write every image's reference and index digest into this file, a ref@digest line each (make release's digests.txt).")
	fs.StringVar(&o.baseDir, "base-dir", "", "Only write the images' base files (CA roots, passwd, group, /data, /tmp) into this directory, for the Dockerfile.")
}

func main() {
	var o options
	fs := flag.NewFlagSet("imagebuild", flag.ExitOnError)
	o.bindFlags(fs)
	_ = fs.Parse(os.Args[1:])
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, o); err != nil {
		fmt.Fprintln(os.Stderr, "imagebuild:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, o options) error {
	if o.baseDir != "" {
		return ociimage.WriteBaseDir(o.baseDir)
	}
	if o.layout == "" && o.archive == "" && o.push == "" {
		return errors.New("nothing to write: give -layout, -archive or -push")
	}
	if o.epoch == "" {
		return errors.New("-source-date-epoch (or SOURCE_DATE_EPOCH) is required, so builds are reproducible")
	}
	sec, err := strconv.ParseInt(o.epoch, 10, 64)
	if err != nil {
		return fmt.Errorf("-source-date-epoch %q: %w", o.epoch, err)
	}
	created := time.Unix(sec, 0).UTC()
	var platforms []ociimage.Platform
	for _, s := range strings.Split(o.platforms, ",") {
		p, err := ociimage.ParsePlatform(strings.TrimSpace(s))
		if err != nil {
			return err
		}
		platforms = append(platforms, p)
	}

	specs, err := o.specs(created)
	if err != nil {
		return err
	}
	b, err := ociimage.NewBuilder(created)
	if err != nil {
		return err
	}
	var built []*ociimage.Built
	var digests strings.Builder
	for _, s := range specs {
		img, err := b.Build(s, platforms)
		if err != nil {
			return err
		}
		d, err := img.Index.Digest()
		if err != nil {
			return fmt.Errorf("digest of %s: %w", s.Ref, err)
		}
		fmt.Fprintf(os.Stderr, "==> %s@%s\n", s.Ref, d)
		fmt.Fprintf(&digests, "%s@%s\n", s.Ref, d)
		built = append(built, img)
	}
	if o.digests != "" {
		if err := os.WriteFile(o.digests, []byte(digests.String()), 0o644); err != nil {
			return fmt.Errorf("write the digests: %w", err)
		}
	}

	if o.layout != "" {
		if err := ociimage.WriteLayout(o.layout, built); err != nil {
			return err
		}
		fmt.Fprintf(os.Stderr, "==> wrote OCI layout %s\n", o.layout)
	}
	if o.archive != "" {
		if err := ociimage.WriteArchive(o.archive, built, created); err != nil {
			return err
		}
		fmt.Fprintf(os.Stderr, "==> wrote %s\n", o.archive)
	}
	if o.push != "" {
		if err := ociimage.Push(ctx, o.push, built, o.insecure, os.Stderr); err != nil {
			return err
		}
	}
	if o.sizes {
		ociimage.SizeTable(os.Stdout, built)
	}
	return nil
}

// specs turns the -service and -third-party flags into image specs.
func (o options) specs(created time.Time) ([]ociimage.Spec, error) {
	var specs []ociimage.Spec
	if len(o.services) > 0 && (o.tag == "" || o.version == "" || o.revision == "") {
		return nil, errors.New("-service needs -tag, -version and -revision")
	}
	for _, s := range o.services {
		svc, bin, ok := strings.Cut(s, "=")
		if !ok || svc == "" || bin == "" {
			return nil, fmt.Errorf("-service %q: want name=binary", s)
		}
		ref := strings.TrimSuffix(o.registry, "/") + "/" + svc + ":" + o.tag
		specs = append(specs, ociimage.HeadwaterSpec(ref, svc, bin, o.version, o.revision, created))
	}
	for _, s := range o.thirdParty {
		kind, rest, ok := strings.Cut(s, "=")
		ref, bin, ok2 := strings.Cut(rest, "@")
		if !ok || !ok2 || ref == "" || bin == "" {
			return nil, fmt.Errorf("-third-party %q: want kind=ref@binary", s)
		}
		spec, err := ociimage.ThirdPartySpec(kind, ref, bin, created)
		if err != nil {
			return nil, err
		}
		specs = append(specs, spec)
	}
	if len(specs) == 0 {
		return nil, errors.New("no images: give -service or -third-party")
	}
	return specs, nil
}
