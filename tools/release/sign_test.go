package main

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// fakeBuild stands in for go build (which takes minutes for every
// platform): it writes each binary as a small file naming its target.
func fakeBuild(calls *int) func(options, string, string, string) ([]string, error) {
	return func(_ options, goos, goarch, dir string) ([]string, error) {
		*calls++
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return nil, err
		}
		var out []string
		for _, b := range Binaries {
			name := filepath.Base(b)
			if goos == "windows" {
				name += ".exe"
			}
			p := filepath.Join(dir, name)
			if err := os.WriteFile(p, []byte(name+" for "+goos+"/"+goarch), 0o755); err != nil {
				return nil, err
			}
			out = append(out, p)
		}
		return out, nil
	}
}

// needTool skips without name, or fails when .ci/run (which installs it)
// said so.
func needTool(t *testing.T, name, pkg string) {
	t.Helper()
	if _, err := exec.LookPath(name); err != nil {
		if os.Getenv("QUICTUN_E2E_REQUIRE_TOOLS") != "" {
			t.Fatalf("%s not installed (apt-get install %s); QUICTUN_E2E_REQUIRE_TOOLS is set, so this is a failure, not a skip", name, pkg)
		}
		t.Skipf("%s not installed (apt-get install %s)", name, pkg)
	}
}

// newKey generates a throwaway ed25519 key in a temporary directory and
// returns its path and an allowed_signers file naming it for identity.
func newKey(t *testing.T, identity string) (key, signers string) {
	t.Helper()
	dir := t.TempDir()
	key = filepath.Join(dir, "key")
	runCmd(t, "", "ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", identity, "-f", key)
	pub, err := os.ReadFile(key + ".pub")
	if err != nil {
		t.Fatal(err)
	}
	signers = filepath.Join(dir, "allowed_signers")
	line := identity + ` namespaces="file" ` + string(pub)
	if err := os.WriteFile(signers, []byte(line), 0o644); err != nil {
		t.Fatal(err)
	}
	return key, signers
}

func runCmd(t *testing.T, dir, name string, args ...string) string {
	t.Helper()
	cmd := exec.Command(name, args...)
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return strings.TrimSpace(string(out))
}

// testRelease builds a release of fake binaries into a temporary directory
// as make release does (flags as the Makefile passes them), with key if
// not empty.
func testRelease(t *testing.T, key string) (options, error) {
	t.Helper()
	o, err := parseOptions([]string{"archives", "--root", "../..", "--out", t.TempDir(), "--version", "v9.9.9",
		"--mtime", "1764100000", "--ldflags", "-s -w -X main.version=v9.9.9",
		"--targets", "linux/amd64 windows/amd64", "--signing-key", key})
	if err != nil {
		t.Fatal(err)
	}
	var calls int
	o.build = fakeBuild(&calls)
	return o, archives(o)
}

// verify runs scripts/verify-release.sh [flags] dir signers [identity], as
// SECURITY.md tells a user to.
func verify(dir, signers string, flags []string, identity ...string) ([]byte, error) {
	args := append(append(append([]string{"../../scripts/verify-release.sh"}, flags...), dir, signers), identity...)
	return exec.Command("bash", args...).CombinedOutput()
}

// copyDir copies the release directory src (no subdirectories).
func copyDir(t *testing.T, src string) string {
	t.Helper()
	dst := t.TempDir()
	entries, err := os.ReadDir(src)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		b, err := os.ReadFile(filepath.Join(src, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dst, e.Name()), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dst
}

// flipByte changes the byte at off (from the end if negative) of dir/name.
func flipByte(t *testing.T, dir, name string, off int) {
	t.Helper()
	p := filepath.Join(dir, name)
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	if off < 0 {
		off += len(b)
	}
	b[off] ^= 0x01
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

// signedRelease is a release of fake binaries signed with a throwaway key,
// and an allowed_signers file naming that key for release@quictun.test.
func signedRelease(t *testing.T) (o options, signers string) {
	t.Helper()
	needTool(t, "ssh-keygen", "openssh-client")
	key, signers := newKey(t, "release@quictun.test")
	o, err := testRelease(t, key)
	if err != nil {
		t.Fatal(err)
	}
	return o, signers
}

// TestSignedReleaseVerifies: with a throwaway key the release is signed and
// verifies as SECURITY.md says: scripts/verify-release.sh (every file, or
// only the one archive a user downloaded), and the two commands by hand.
func TestSignedReleaseVerifies(t *testing.T) {
	o, signers := signedRelease(t)
	for _, args := range [][]string{nil, {"-a"}} {
		if out, err := verify(o.out, signers, args); err != nil {
			t.Fatalf("verify-release.sh %v of a signed release: %v\n%s", args, err, out)
		}
	}
	// A user downloads one archive (each, as SHA256SUMS sorts them first or last).
	for _, keep := range []string{"quictun_v9.9.9_linux_amd64.tar.gz", "quictun_v9.9.9_windows_amd64.zip"} {
		dir := copyDir(t, o.out)
		for _, f := range []string{"quictun_v9.9.9_linux_amd64.tar.gz", "quictun_v9.9.9_windows_amd64.zip", ProvenanceFile} {
			if f != keep {
				_ = os.Remove(filepath.Join(dir, f))
			}
		}
		if out, err := verify(dir, signers, nil); err != nil || !bytes.Contains(out, []byte(keep+": OK")) {
			t.Fatalf("verify-release.sh with only %s: %v\n%s", keep, err, out)
		}
	}
	sums, err := os.Open(filepath.Join(o.out, "SHA256SUMS"))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sums.Close() }()
	cmd := exec.Command("ssh-keygen", "-Y", "verify", "-f", signers, "-I", "release@quictun.test", "-n", "file", "-s", filepath.Join(o.out, SigFile))
	cmd.Stdin = sums
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("ssh-keygen -Y verify by hand: %v\n%s", err, out)
	}
	runCmd(t, o.out, "sha256sum", "-c", "--strict", "SHA256SUMS")
}

// TestTamperedReleaseFails: each kind of tampering fails verification: a
// changed SHA256SUMS (its hash of an archive replaced by the hash of a
// substitute, or one byte), archive or provenance, a missing signature, a
// signature by another key, for another identity or another namespace, no
// archive at all.
func TestTamperedReleaseFails(t *testing.T) {
	o, signers := signedRelease(t)
	_, otherSigners := newKey(t, "release@quictun.test")
	archive := "quictun_v9.9.9_linux_amd64.tar.gz"
	for _, tc := range []struct {
		name     string
		tamper   func(t *testing.T, dir string)
		signers  string
		args     []string
		identity []string
	}{
		{name: "SHA256SUMS names another archive", tamper: func(t *testing.T, dir string) { substitute(t, dir, archive) }},
		{name: "SHA256SUMS one byte changed", tamper: func(t *testing.T, dir string) { flipByte(t, dir, "SHA256SUMS", 0) }},
		{name: "archive one byte changed", tamper: func(t *testing.T, dir string) { flipByte(t, dir, archive, -1) }},
		{name: "archive one byte changed, every file checked", args: []string{"-a"},
			tamper: func(t *testing.T, dir string) { flipByte(t, dir, "quictun_v9.9.9_windows_amd64.zip", -1) }},
		{name: "provenance changed", tamper: func(t *testing.T, dir string) { flipByte(t, dir, ProvenanceFile, 20) }},
		{name: "signature missing", tamper: func(t *testing.T, dir string) { _ = os.Remove(filepath.Join(dir, SigFile)) }},
		{name: "signature by another key", signers: otherSigners},
		{name: "another identity", identity: []string{"other@quictun.test"}},
		{name: "key allowed for another namespace", signers: writeSigners(t, strings.Replace(readFile(t, signers), `"file"`, `"git"`, 1))},
		{name: "no archive present", tamper: func(t *testing.T, dir string) {
			for _, a := range []string{archive, "quictun_v9.9.9_windows_amd64.zip"} {
				_ = os.Remove(filepath.Join(dir, a))
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := copyDir(t, o.out)
			if tc.tamper != nil {
				tc.tamper(t, dir)
			}
			s := signers
			if tc.signers != "" {
				s = tc.signers
			}
			if out, err := verify(dir, s, tc.args, tc.identity...); err == nil {
				t.Fatalf("verify-release.sh passed a tampered release:\n%s", out)
			}
		})
	}
}

// substitute replaces dir/archive with other bytes, and its line in
// SHA256SUMS with their hash.
func substitute(t *testing.T, dir, archive string) {
	t.Helper()
	other := []byte("not the release")
	if err := os.WriteFile(filepath.Join(dir, archive), other, 0o644); err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(other)
	lines := strings.Split(readFile(t, filepath.Join(dir, "SHA256SUMS")), "\n")
	for i, l := range lines {
		if strings.HasSuffix(l, "  "+archive) {
			lines[i] = hex.EncodeToString(sum[:]) + "  " + archive
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "SHA256SUMS"), []byte(strings.Join(lines, "\n")), 0o644); err != nil {
		t.Fatal(err)
	}
}

func readFile(t *testing.T, p string) string {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func writeSigners(t *testing.T, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "allowed_signers")
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestProvenance: provenance.json names the HEAD commit and whether the tree
// is dirty, the Go version go build uses, quic-go's BASE line and every
// patch with its SHA-256, the build flags, SOURCE_DATE_EPOCH as the date,
// and each archive's hash as SHA256SUMS has it; SHA256SUMS covers it; the
// same inputs give the same bytes.
func TestProvenance(t *testing.T) {
	o, err := testRelease(t, "")
	if err != nil {
		t.Fatal(err)
	}
	raw := readFile(t, filepath.Join(o.out, ProvenanceFile))
	var p Provenance
	if err := json.Unmarshal([]byte(raw), &p); err != nil {
		t.Fatal(err)
	}
	if head := runCmd(t, "../..", "git", "rev-parse", "HEAD"); p.Commit != head || len(head) != 40 {
		t.Errorf("commit %q, HEAD is %q", p.Commit, head)
	}
	if dirty := runCmd(t, "../..", "git", "status", "--porcelain") != ""; p.Dirty != dirty {
		t.Errorf("dirty %v, git status says %v", p.Dirty, dirty)
	}
	if goVersion := runCmd(t, "../..", "go", "env", "GOVERSION"); p.GoVersion != goVersion || goVersion == "" {
		t.Errorf("go_version %q, go env GOVERSION %q", p.GoVersion, goVersion)
	}
	if !strings.HasPrefix(p.QUICGo.Base, "github.com/quic-go/quic-go v") || !strings.Contains(readFile(t, "../../third_party/quic-go/BASE"), p.QUICGo.Base+"\n") {
		t.Errorf("quic_go.base %q is not BASE's module line", p.QUICGo.Base)
	}
	// The patches' hashes as sha256sum prints them, in the shell's order.
	want := runCmd(t, "../../third_party/quic-go/patches", "bash", "-c", "sha256sum *.patch")
	var got []string
	for _, h := range p.QUICGo.Patches {
		got = append(got, h.SHA256+"  "+h.Name)
	}
	if strings.Join(got, "\n") != want || len(got) == 0 {
		t.Errorf("quic_go.patches:\n%s\nsha256sum:\n%s", strings.Join(got, "\n"), want)
	}
	wantCmd := append([]string{"go", "build", "-trimpath", "-ldflags", "-s -w -X main.version=v9.9.9"}, Binaries...)
	if !slices.Equal(p.Build.Command, wantCmd) || !slices.Contains(p.Build.Env, "CGO_ENABLED=0") ||
		!slices.Equal(p.Build.Targets, []string{"linux/amd64", "windows/amd64"}) {
		t.Errorf("build %+v", p.Build)
	}
	if p.SourceDateEpoch != 1764100000 || p.BuildDate != time.Unix(1764100000, 0).UTC().Format(time.RFC3339) || p.Version != "v9.9.9" {
		t.Errorf("version %q, source_date_epoch %d, build_date %q", p.Version, p.SourceDateEpoch, p.BuildDate)
	}
	sums := readFile(t, filepath.Join(o.out, "SHA256SUMS"))
	if len(p.Archives) != 2 {
		t.Errorf("archives %v", p.Archives)
	}
	for _, a := range p.Archives {
		if !strings.Contains(sums, a.SHA256+"  "+a.Name+"\n") {
			t.Errorf("archive %s %s is not in SHA256SUMS:\n%s", a.Name, a.SHA256, sums)
		}
	}
	sum := sha256.Sum256([]byte(raw))
	if !strings.Contains(sums, hex.EncodeToString(sum[:])+"  "+ProvenanceFile+"\n") {
		t.Errorf("SHA256SUMS does not cover %s:\n%s", ProvenanceFile, sums)
	}
	again, err := testRelease(t, "")
	if err != nil {
		t.Fatal(err)
	}
	if readFile(t, filepath.Join(again.out, ProvenanceFile)) != raw || readFile(t, filepath.Join(again.out, "SHA256SUMS")) != sums {
		t.Error("the same inputs gave a different provenance or SHA256SUMS")
	}
}

// TestSigningKeyErrors: a signing key that is given but unusable fails the
// release before anything is built (no silent unsigned release), and so
// does a root that is not a git clone (no commit to name); a key whose
// signing fails fails the release and leaves no signature; a release
// without a key is built, unsigned, with no signature file.
func TestSigningKeyErrors(t *testing.T) {
	needTool(t, "ssh-keygen", "openssh-client")
	garbage := filepath.Join(t.TempDir(), "garbage")
	if err := os.WriteFile(garbage, []byte("not a key\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ name, key, errText string }{
		{"missing file", filepath.Join(t.TempDir(), "nonexistent"), "no such file"},
		{"not a key", garbage, "not an SSH key"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o, err := parseOptions([]string{"archives", "--root", "../..", "--out", t.TempDir(), "--version", "v1", "--signing-key", tc.key})
			if err != nil {
				t.Fatal(err)
			}
			var calls int
			o.build = fakeBuild(&calls)
			err = archives(o)
			if err == nil || !strings.Contains(err.Error(), tc.errText) {
				t.Fatalf("error %v, want one with %q", err, tc.errText)
			}
			if calls != 0 {
				t.Errorf("%d targets built before the key was checked", calls)
			}
			if entries, _ := os.ReadDir(o.out); len(entries) != 0 {
				t.Errorf("the failed release left %d files", len(entries))
			}
		})
	}
	t.Run("not a git clone", func(t *testing.T) {
		o, err := parseOptions([]string{"archives", "--root", t.TempDir(), "--out", t.TempDir(), "--version", "v1"})
		if err != nil {
			t.Fatal(err)
		}
		var calls int
		o.build = fakeBuild(&calls)
		if err := archives(o); err == nil || !strings.Contains(err.Error(), "git clone") || calls != 0 {
			t.Fatalf("error %v after %d targets built, want a provenance error before any", err, calls)
		}
	})
	t.Run("wrong passphrase", func(t *testing.T) {
		// A key ssh-keygen -l reads, whose signing fails: the release fails
		// and leaves no signature (the passphrase comes from SSH_ASKPASS,
		// not the terminal, so the test never waits on one).
		key := filepath.Join(t.TempDir(), "key")
		runCmd(t, "", "ssh-keygen", "-q", "-t", "ed25519", "-N", "right", "-f", key)
		askpass := filepath.Join(t.TempDir(), "askpass")
		if err := os.WriteFile(askpass, []byte("#!/bin/sh\necho wrong\n"), 0o755); err != nil {
			t.Fatal(err)
		}
		t.Setenv("SSH_ASKPASS", askpass)
		t.Setenv("SSH_ASKPASS_REQUIRE", "force")
		o, err := testRelease(t, key)
		if err == nil || !strings.Contains(err.Error(), "ssh-keygen -Y sign") {
			t.Fatalf("error %v, want ssh-keygen -Y sign's", err)
		}
		if _, err := os.Stat(filepath.Join(o.out, SigFile)); !os.IsNotExist(err) {
			t.Errorf("a failed signing left %s: %v", SigFile, err)
		}
	})
	t.Run("no key: unsigned", func(t *testing.T) {
		o, err := testRelease(t, "")
		if err != nil {
			t.Fatal(err)
		}
		if _, err := os.Stat(filepath.Join(o.out, SigFile)); !os.IsNotExist(err) {
			t.Errorf("an unsigned release has %s: %v", SigFile, err)
		}
		_, signers := newKey(t, "release@quictun.test")
		out, err := verify(o.out, signers, nil)
		if err == nil || !bytes.Contains(out, []byte("not signed")) {
			t.Errorf("verify-release.sh of an unsigned release: %v\n%s", err, out)
		}
	})
}

// TestSignatureOfAnotherKeyIsRefused: checkSig, the release's own check of
// its new signature, refuses a valid signature by a key other than the one
// named.
func TestSignatureOfAnotherKeyIsRefused(t *testing.T) {
	needTool(t, "ssh-keygen", "openssh-client")
	key, _ := newKey(t, "a")
	other, _ := newKey(t, "b")
	o, err := testRelease(t, key)
	if err != nil {
		t.Fatal(err)
	}
	fp, err := keyFingerprint(other)
	if err != nil {
		t.Fatal(err)
	}
	if err := checkSig(o.out, fp); err == nil || !strings.Contains(err.Error(), "not by key "+fp) {
		t.Fatalf("checkSig with another key's fingerprint: %v", err)
	}
	own, err := keyFingerprint(key)
	if err != nil {
		t.Fatal(err)
	}
	if err := checkSig(o.out, own); err != nil {
		t.Fatal(err)
	}
}

// TestProvenanceEnv: the provenance's environment lists a code-generation
// setting (GOAMD64, GOARM64, ...) that is set, for the targets' architectures:
// go env shows GOARM64 only for GOARCH=arm64.
func TestProvenanceEnv(t *testing.T) {
	t.Setenv("GOAMD64", "v3")
	t.Setenv("GOARM64", "v8.1")
	for _, tc := range []struct {
		targets []string
		want    []string
		not     []string
	}{
		{[]string{"linux/amd64", "linux/arm64"}, []string{"CGO_ENABLED=0", "GOWORK=off", "GOAMD64=v3", "GOARM64=v8.1"}, nil},
		{[]string{"windows/amd64"}, []string{"GOAMD64=v3"}, []string{"GOARM64=v8.1"}},
	} {
		_, env, err := goEnv("../..", tc.targets)
		if err != nil {
			t.Fatal(err)
		}
		for _, w := range tc.want {
			if !slices.Contains(env, w) {
				t.Errorf("targets %v: env %v has no %s", tc.targets, env, w)
			}
		}
		for _, n := range tc.not {
			if slices.Contains(env, n) {
				t.Errorf("targets %v: env %v has %s", tc.targets, env, n)
			}
		}
	}
}

// TestArchiveContents: every archive holds, beside the binaries, the license,
// the security policy and deploy/'s units and configs (issue 33), read from
// the repository.
func TestArchiveContents(t *testing.T) {
	o, err := testRelease(t, "")
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"README.md", "LICENSE", "SECURITY.md", "deploy/README.md",
		"deploy/systemd/quictun-server.service", "deploy/systemd/quictun-client.service",
		"deploy/sysctl/60-quictun.conf", "deploy/config/server.yaml", "deploy/config/client.yaml"}
	for _, a := range []struct {
		name string
		list func(*testing.T, []byte) map[string]string
	}{
		{"quictun_v9.9.9_linux_amd64.tar.gz", listTarGz},
		{"quictun_v9.9.9_windows_amd64.zip", listZip},
	} {
		b, err := os.ReadFile(filepath.Join(o.out, a.name))
		if err != nil {
			t.Fatal(err)
		}
		top := strings.TrimSuffix(strings.TrimSuffix(a.name, ".tar.gz"), ".zip")
		got := a.list(t, b)
		for _, w := range want {
			if !strings.HasPrefix(got[top+"/"+w], "-rw-r--r-- ") {
				t.Errorf("%s: %s missing or not 0644 (%q)", a.name, w, got[top+"/"+w])
			}
		}
		if !strings.Contains(got[top+"/LICENSE"], "Apache License") {
			t.Errorf("%s: LICENSE is not the Apache License", a.name)
		}
	}
}
