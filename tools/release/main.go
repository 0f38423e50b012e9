// Command release builds quictun's release artefacts, reproducibly: the same
// commit, Go version and flags give the same bytes.
//
//	release archives --version V --out DIR [--targets "linux/amd64 ..."] [--signing-key KEY]
//	    one archive per target (tar.gz; zip for Windows) holding the binaries,
//	    README.md, LICENSE, SECURITY.md and deploy/'s README, systemd units,
//	    sysctl drop-in and example configs under quictun_V_OS_ARCH/; provenance.json
//	    (commit, Go, quic-go base and patches, build flags and date, archive
//	    hashes); SHA256SUMS of them all; with --signing-key, SHA256SUMS.sig
//	    (ssh-keygen -Y sign -n file; scripts/verify-release.sh checks it)
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
//
// Without --signing-key the release is built unsigned, and says so. With a
// key that ssh-keygen cannot load, nothing is built; a signature that does
// not check against the key fails the release.
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
	targets, arches, signingKey       string
	mtime                             int64
	// build builds one target's binaries (the build function; tests give
	// a stand-in that writes small files)
	build func(o options, goos, goarch, dir string) ([]string, error)
}

func run(args []string) error {
	o, err := parseOptions(args)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(o.out, 0o755); err != nil {
		return err
	}
	if args[0] == "archives" {
		return archives(o)
	}
	return images(o)
}

func parseOptions(args []string) (options, error) {
	if len(args) == 0 || (args[0] != "archives" && args[0] != "image") {
		return options{}, errors.New("usage: release archives|image --version V --out DIR [flags]")
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
	fs.StringVar(&o.signingKey, "signing-key", "", "archives: SSH key that signs SHA256SUMS (ssh-keygen -Y sign -n file); empty: unsigned")
	if err := fs.Parse(args[1:]); err != nil {
		return options{}, err
	}
	if o.version == "" || o.out == "" {
		return options{}, errors.New("--version and --out are required")
	}
	o.build = build
	return o, nil
}

// buildEnv is go build's environment for every target, besides GOOS and GOARCH.
var buildEnv = []string{"CGO_ENABLED=0", "GOWORK=off"}

// buildFlags are go build's flags for every target, besides -o.
func buildFlags(o options) []string {
	return []string{"-trimpath", "-ldflags", o.ldflags}
}

// build builds Binaries for goos/goarch into dir and returns their paths.
func build(o options, goos, goarch, dir string) ([]string, error) {
	args := append(append([]string{"build"}, buildFlags(o)...), "-o", dir+string(filepath.Separator))
	cmd := exec.Command("go", append(args, Binaries...)...)
	cmd.Dir = o.root
	cmd.Env = append(append(os.Environ(), buildEnv...), "GOOS="+goos, "GOARCH="+goarch)
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
	var fp string
	if o.signingKey != "" {
		var err error
		if fp, err = keyFingerprint(o.signingKey); err != nil {
			return err
		}
	}
	prov, err := sourceProvenance(o)
	if err != nil {
		return err
	}
	tmp, err := os.MkdirTemp("", "quictun-release-")
	if err != nil {
		return err
	}
	defer func() { _ = os.RemoveAll(tmp) }()
	docs, err := releaseDocs(o.root)
	if err != nil {
		return err
	}
	mtime := time.Unix(o.mtime, 0).UTC()
	var names []string
	for _, t := range strings.Fields(o.targets) {
		goos, goarch, ok := strings.Cut(t, "/")
		if !ok {
			return fmt.Errorf("target %q is not GOOS/GOARCH", t)
		}
		bins, err := o.build(o, goos, goarch, filepath.Join(tmp, goos+"_"+goarch))
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
	return finish(o, prov, names, fp)
}

// releaseDocs are the files every archive holds beside the binaries: the
// README, the license, the security policy (how to verify a release, the
// threat model), and deploy/'s guide, systemd units, sysctl drop-in and
// example configs, which the install steps use next.
func releaseDocs(root string) ([]file, error) {
	names := []string{"README.md", "LICENSE", "SECURITY.md", "deploy/README.md"}
	for _, pattern := range []string{"deploy/systemd/*.service", "deploy/sysctl/*.conf", "deploy/config/*.yaml"} {
		m, err := filepath.Glob(filepath.Join(root, pattern))
		if err != nil {
			return nil, err
		}
		if len(m) == 0 {
			return nil, fmt.Errorf("%s: no files in %s", pattern, root)
		}
		for _, p := range m {
			rel, err := filepath.Rel(root, p)
			if err != nil {
				return nil, err
			}
			names = append(names, filepath.ToSlash(rel))
		}
	}
	var docs []file
	for _, d := range names {
		b, err := os.ReadFile(filepath.Join(root, filepath.FromSlash(d)))
		if err != nil {
			return nil, err
		}
		docs = append(docs, file{name: d, mode: 0o644, data: b})
	}
	return docs, nil
}

// finish writes the provenance prov of the archives names, SHA256SUMS of
// both, and its signature by o.signingKey (fingerprint fp), if any.
func finish(o options, prov *Provenance, names []string, fp string) error {
	if err := writeProvenance(o, prov, names); err != nil {
		return err
	}
	if err := writeSums(o.out, append(slices.Clone(names), ProvenanceFile)); err != nil {
		return err
	}
	sig := filepath.Join(o.out, SigFile)
	if err := os.Remove(sig); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	if o.signingKey == "" {
		fmt.Fprintf(os.Stderr, "release: UNSIGNED: no --signing-key (make release SIGNING_KEY=...), so no %s: "+
			"a verifier can check the archives against SHA256SUMS, not who made them\n", SigFile)
		return nil
	}
	if err := signSums(o.out, o.signingKey, fp); err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "wrote %s: signed by %s key %s\n", sig, o.signingKey, fp)
	return nil
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
