package main

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// ProvenanceFile is the name of the provenance record in a release
// directory; SHA256SUMS covers it, so its signature covers it too.
const ProvenanceFile = "provenance.json"

// Provenance says what a release was built from and how: enough to rebuild
// it byte for byte (make release at Commit with GoVersion and
// SOURCE_DATE_EPOCH=SourceDateEpoch) and to compare the result.
type Provenance struct {
	Version         string     `json:"version"`
	Commit          string     `json:"commit"`
	Dirty           bool       `json:"dirty"` // uncommitted changes or untracked files (git status --porcelain)
	GoVersion       string     `json:"go_version"`
	QUICGo          QUICGo     `json:"quic_go"`
	Build           Build      `json:"build"`
	SourceDateEpoch int64      `json:"source_date_epoch"`
	BuildDate       string     `json:"build_date"` // SourceDateEpoch, RFC 3339 UTC: every file time in the archives
	Archives        []FileHash `json:"archives"`
}

// QUICGo is the patched quic-go the binaries are built with
// (third_party/quic-go, applied by scripts/quic-go.sh).
type QUICGo struct {
	Base    string     `json:"base"`    // third_party/quic-go/BASE: module, version and go.sum hash
	Patches []FileHash `json:"patches"` // third_party/quic-go/patches/*.patch in the order applied
}

// Build is how every binary was built: Command for each of Targets, with
// Env and GOOS/GOARCH set.
type Build struct {
	Command []string `json:"command"`
	Env     []string `json:"env"`
	Targets []string `json:"targets"`
}

// FileHash is a file's name and its SHA-256, in hex.
type FileHash struct {
	Name   string `json:"name"`
	SHA256 string `json:"sha256"`
}

// writeProvenance completes p, the build's source and settings, with
// the archives names in o.out and writes it to o.out/ProvenanceFile.
func writeProvenance(o options, p *Provenance, names []string) error {
	var err error
	if p.Archives, err = hashFiles(o.out, slices.Sorted(slices.Values(names))); err != nil {
		return err
	}
	b, err := json.MarshalIndent(p, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(o.out, ProvenanceFile), append(b, '\n'), 0o644)
}

// sourceProvenance is what the release is built from and how, read before
// anything is built: all of Provenance but the archives.
func sourceProvenance(o options) (*Provenance, error) {
	commit, err := command(o.root, "git", "rev-parse", "HEAD")
	if err != nil {
		return nil, fmt.Errorf("provenance: %w (a release is built from a git clone)", err)
	}
	status, err := command(o.root, "git", "status", "--porcelain")
	if err != nil {
		return nil, fmt.Errorf("provenance: %w", err)
	}
	goVersion, env, err := goEnv(o.root, strings.Fields(o.targets))
	if err != nil {
		return nil, fmt.Errorf("provenance: %w", err)
	}
	qg, err := quicGo(filepath.Join(o.root, "third_party", "quic-go"))
	if err != nil {
		return nil, fmt.Errorf("provenance: %w", err)
	}
	return &Provenance{
		Version:   o.version,
		Commit:    commit,
		Dirty:     status != "",
		GoVersion: goVersion,
		QUICGo:    *qg,
		Build: Build{
			Command: append(append([]string{"go", "build"}, buildFlags(o)...), Binaries...),
			Env:     env,
			Targets: strings.Fields(o.targets),
		},
		SourceDateEpoch: o.mtime,
		BuildDate:       time.Unix(o.mtime, 0).UTC().Format(time.RFC3339),
	}, nil
}

// codegenSettings are the go command's settings, besides GOOS and GOARCH,
// that change the code go build generates; provenance lists those set.
var codegenSettings = []string{"GOFLAGS", "GOEXPERIMENT", "GOFIPS140", "GOAMD64", "GOARM64", "GOARM", "GO386"}

// goEnv is the Go version go build uses in the repository root (the
// toolchain go.mod selects), and buildEnv followed by the codegenSettings
// set (environment or go env -w) for the targets' architectures.
func goEnv(root string, targets []string) (version string, env []string, err error) {
	if version, err = goEnvCmd(root, "", "GOVERSION"); err != nil {
		return "", nil, err
	}
	set := map[string]string{}
	for _, t := range targets {
		_, arch, _ := strings.Cut(t, "/")
		// go env shows GOAMD64 only for GOARCH=amd64, GOARM64 for arm64, ...
		out, err := goEnvCmd(root, arch, append([]string{"-json", "-changed"}, codegenSettings...)...)
		if err != nil {
			return "", nil, err
		}
		var m map[string]string
		if err := json.Unmarshal([]byte(out), &m); err != nil {
			return "", nil, fmt.Errorf("go env: %w", err)
		}
		maps.Copy(set, m)
	}
	env = slices.Clone(buildEnv)
	for _, k := range slices.Sorted(maps.Keys(set)) {
		env = append(env, k+"="+set[k])
	}
	return version, env, nil
}

// goEnvCmd runs go env args in root with GOWORK=off, and GOARCH=arch if
// not empty, and returns its output, which must not be empty.
func goEnvCmd(root, arch string, args ...string) (string, error) {
	cmd := exec.Command("go", append([]string{"env"}, args...)...)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "GOWORK=off")
	if arch != "" {
		cmd.Env = append(cmd.Env, "GOARCH="+arch)
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("go env %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	if s := strings.TrimSpace(string(out)); s != "" {
		return s, nil
	}
	return "", fmt.Errorf("go env %s printed nothing", strings.Join(args, " "))
}

// quicGo reads dir/BASE's module line and hashes dir/patches/*.patch.
func quicGo(dir string) (*QUICGo, error) {
	base, err := os.ReadFile(filepath.Join(dir, "BASE"))
	if err != nil {
		return nil, err
	}
	var q QUICGo
	for _, line := range strings.Split(string(base), "\n") {
		if line = strings.TrimSpace(line); line != "" && !strings.HasPrefix(line, "#") {
			q.Base = line
			break
		}
	}
	if q.Base == "" {
		return nil, fmt.Errorf("%s/BASE names no module", dir)
	}
	// filepath.Glob sorts, as the shell's glob in scripts/quic-go.sh does.
	patches, err := filepath.Glob(filepath.Join(dir, "patches", "*.patch"))
	if err != nil {
		return nil, err
	}
	for i := range patches {
		patches[i] = filepath.Base(patches[i])
	}
	if q.Patches, err = hashFiles(filepath.Join(dir, "patches"), patches); err != nil {
		return nil, err
	}
	return &q, nil
}

func hashFiles(dir string, names []string) ([]FileHash, error) {
	out := []FileHash{}
	for _, n := range names {
		data, err := os.ReadFile(filepath.Join(dir, n))
		if err != nil {
			return nil, err
		}
		sum := sha256.Sum256(data)
		out = append(out, FileHash{Name: n, SHA256: hex.EncodeToString(sum[:])})
	}
	return out, nil
}

// command runs name args in dir and returns its output, trimmed.
func command(dir, name string, args ...string) (string, error) {
	cmd := exec.Command(name, args...)
	cmd.Dir = dir
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return strings.TrimSpace(string(out)), nil
}
