// Command release builds quictun's release artefacts, reproducibly: the same
// commit, Go version and flags give the same bytes.
//
//	release archives --version V --out DIR [--targets "linux/amd64 ..."]
//	    one archive per target (tar.gz; zip for Windows) holding the binaries,
//	    README.md and LICENSE (if any) under quictun_V_OS_ARCH/, and SHA256SUMS
//	release image --version V --out DIR [--repo quictun] [--arches "amd64 arm64"]
//	    an OCI image per Linux architecture, built without a Docker daemon:
//	    DIR/quictun_V_linux_ARCH.image.tar (docker load, crane push) and DIR/oci,
//	    an OCI layout whose index holds every architecture (crane push --index)
//
// Binaries are built with go build -trimpath, CGO_ENABLED=0 and --ldflags;
// every file time in the archives and the image is --mtime (seconds since
// 1970, the commit's time from the Makefile). It is its own module (outside
// go.work) so that the product's modules do not depend on
// go-containerregistry; run it with GOWORK=off from this directory, or
// through make release / make image.
package main

import (
	"archive/tar"
	"archive/zip"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// Binaries are the packages a release holds, relative to the repository root.
var Binaries = []string{"./cmd/quictun-server", "./cmd/quictun-client", "./tools/latency-client"}

// DefaultTargets are the platforms of a release.
const DefaultTargets = "linux/amd64 linux/arm64 darwin/amd64 darwin/arm64 windows/amd64"

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "release:", err)
		os.Exit(1)
	}
}

type options struct {
	root, version, out, ldflags, repo string
	targets, arches                   string
	mtime                             int64
}

func run(args []string) error {
	if len(args) == 0 || (args[0] != "archives" && args[0] != "image") {
		return errors.New("usage: release archives|image --version V --out DIR [flags]")
	}
	fs := flag.NewFlagSet(args[0], flag.ContinueOnError)
	var o options
	fs.StringVar(&o.root, "root", "../..", "the repository root")
	fs.StringVar(&o.version, "version", "", "the version in names and in the image tag (git describe)")
	fs.StringVar(&o.out, "out", "", "the output directory")
	fs.StringVar(&o.ldflags, "ldflags", "-s -w", "go build -ldflags")
	fs.Int64Var(&o.mtime, "mtime", 0, "every file's time, in seconds since 1970 (the commit's)")
	fs.StringVar(&o.targets, "targets", DefaultTargets, "archives: GOOS/GOARCH pairs")
	fs.StringVar(&o.arches, "arches", "amd64 arm64", "image: Linux architectures")
	fs.StringVar(&o.repo, "repo", "quictun", "image: repository of the tag (deploy/helm values image.repository)")
	if err := fs.Parse(args[1:]); err != nil {
		return err
	}
	if o.version == "" || o.out == "" {
		return errors.New("--version and --out are required")
	}
	if err := os.MkdirAll(o.out, 0o755); err != nil {
		return err
	}
	if args[0] == "archives" {
		return archives(o)
	}
	return images(o)
}

// build builds Binaries for goos/goarch into dir and returns their paths.
func build(o options, goos, goarch, dir string) ([]string, error) {
	cmd := exec.Command("go", append([]string{"build", "-trimpath", "-ldflags", o.ldflags, "-o", dir + string(filepath.Separator)}, Binaries...)...)
	cmd.Dir = o.root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS="+goos, "GOARCH="+goarch, "GOWORK=off")
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("go build %s/%s: %w", goos, goarch, err)
	}
	var out []string
	for _, b := range Binaries {
		name := filepath.Base(b)
		if goos == "windows" {
			name += ".exe"
		}
		out = append(out, filepath.Join(dir, name))
	}
	return out, nil
}

// file is one entry of an archive.
type file struct {
	name string // slash-separated, relative to the archive's top
	mode os.FileMode
	data []byte
}

func archives(o options) error {
	tmp, err := os.MkdirTemp("", "quictun-release-")
	if err != nil {
		return err
	}
	defer func() { _ = os.RemoveAll(tmp) }()
	var docs []file
	for _, d := range []string{"README.md", "LICENSE"} {
		b, err := os.ReadFile(filepath.Join(o.root, d))
		if errors.Is(err, os.ErrNotExist) && d == "LICENSE" {
			continue
		}
		if err != nil {
			return err
		}
		docs = append(docs, file{name: d, mode: 0o644, data: b})
	}
	mtime := time.Unix(o.mtime, 0).UTC()
	var names []string
	for _, t := range strings.Fields(o.targets) {
		goos, goarch, ok := strings.Cut(t, "/")
		if !ok {
			return fmt.Errorf("target %q is not GOOS/GOARCH", t)
		}
		bins, err := build(o, goos, goarch, filepath.Join(tmp, goos+"_"+goarch))
		if err != nil {
			return err
		}
		files := slices.Clone(docs)
		for _, p := range bins {
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			files = append(files, file{name: filepath.Base(p), mode: 0o755, data: b})
		}
		base := fmt.Sprintf("quictun_%s_%s_%s", o.version, goos, goarch)
		var data []byte
		name := base + ".tar.gz"
		if goos == "windows" {
			name = base + ".zip"
			data, err = zipArchive(base, files, mtime)
		} else {
			data, err = tarGz(base, files, mtime)
		}
		if err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(o.out, name), data, 0o644); err != nil {
			return err
		}
		names = append(names, name)
		fmt.Fprintf(os.Stderr, "wrote %s (%d bytes)\n", filepath.Join(o.out, name), len(data))
	}
	return writeSums(o.out, names)
}

// writeSums writes dir/SHA256SUMS for names, as sha256sum prints it
// (sha256sum -c SHA256SUMS checks it).
func writeSums(dir string, names []string) error {
	slices.Sort(names)
	var b strings.Builder
	for _, n := range names {
		data, err := os.ReadFile(filepath.Join(dir, n))
		if err != nil {
			return err
		}
		sum := sha256.Sum256(data)
		fmt.Fprintf(&b, "%s  %s\n", hex.EncodeToString(sum[:]), n)
	}
	return os.WriteFile(filepath.Join(dir, "SHA256SUMS"), []byte(b.String()), 0o644)
}

// tarGz is a gzipped tar of files under top/, owned by root, every time
// mtime, and no gzip name or time: the same files give the same bytes.
func tarGz(top string, files []file, mtime time.Time) ([]byte, error) {
	var buf bytes.Buffer
	gz, err := gzip.NewWriterLevel(&buf, gzip.BestCompression)
	if err != nil {
		return nil, err
	}
	tw := tar.NewWriter(gz)
	if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: top + "/", Mode: 0o755, ModTime: mtime, Format: tar.FormatPAX}); err != nil {
		return nil, err
	}
	for _, f := range sortedFiles(files) {
		h := &tar.Header{Typeflag: tar.TypeReg, Name: top + "/" + f.name, Mode: int64(f.mode), Size: int64(len(f.data)), ModTime: mtime, Format: tar.FormatPAX}
		if err := tw.WriteHeader(h); err != nil {
			return nil, err
		}
		if _, err := tw.Write(f.data); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	if err := gz.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// zipArchive is tarGz's zip: for Windows, whose Explorer opens zip files.
func zipArchive(top string, files []file, mtime time.Time) ([]byte, error) {
	var buf bytes.Buffer
	zw := zip.NewWriter(&buf)
	dir := &zip.FileHeader{Name: top + "/", Modified: mtime}
	dir.SetMode(os.ModeDir | 0o755)
	if _, err := zw.CreateHeader(dir); err != nil {
		return nil, err
	}
	for _, f := range sortedFiles(files) {
		h := &zip.FileHeader{Name: top + "/" + f.name, Method: zip.Deflate, Modified: mtime}
		h.SetMode(f.mode)
		w, err := zw.CreateHeader(h)
		if err != nil {
			return nil, err
		}
		if _, err := io.Copy(w, bytes.NewReader(f.data)); err != nil {
			return nil, err
		}
	}
	if err := zw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

func sortedFiles(files []file) []file {
	s := slices.Clone(files)
	slices.SortFunc(s, func(a, b file) int { return strings.Compare(a.name, b.name) })
	return s
}
