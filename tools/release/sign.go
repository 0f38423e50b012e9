package main

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// SigFile is SHA256SUMS's signature: ssh-keygen -Y sign -n SigNamespace.
const (
	SigFile      = "SHA256SUMS.sig"
	SigNamespace = "file"
)

// keyFingerprint checks, before anything is built, that key is a key
// ssh-keygen can load (a private key, or a public key whose private half
// is in ssh-agent or beside it) and returns its fingerprint (SHA256:...).
func keyFingerprint(key string) (string, error) {
	if _, err := exec.LookPath("ssh-keygen"); err != nil {
		return "", fmt.Errorf("--signing-key needs ssh-keygen (package openssh-client): %w", err)
	}
	if _, err := os.Stat(key); err != nil {
		return "", fmt.Errorf("signing key: %w", err)
	}
	out, err := command("", "ssh-keygen", "-l", "-f", key)
	if err != nil {
		return "", fmt.Errorf("signing key %s is not an SSH key: %w", key, err)
	}
	// "256 SHA256:... comment (ED25519)"
	f := strings.Fields(out)
	if len(f) < 2 || !strings.HasPrefix(f[1], "SHA256:") {
		return "", fmt.Errorf("ssh-keygen -l -f %s printed %q, no SHA256 fingerprint", key, out)
	}
	return f[1], nil
}

// signSums writes dir/SigFile, the signature of dir/SHA256SUMS by key
// (ssh-keygen asks on the terminal for its passphrase, if any), then
// checks that it is a valid signature of SHA256SUMS by the key whose
// fingerprint is fp. A failure leaves no signature file.
func signSums(dir, key, fp string) error {
	sums, err := os.ReadFile(filepath.Join(dir, "SHA256SUMS"))
	if err != nil {
		return err
	}
	// Signing stdin to stdout: ssh-keygen would otherwise ask before
	// overwriting an old signature file.
	cmd := exec.Command("ssh-keygen", "-Y", "sign", "-f", key, "-n", SigNamespace)
	cmd.Stdin = bytes.NewReader(sums)
	cmd.Stderr = os.Stderr
	sig, err := cmd.Output()
	if err != nil {
		return fmt.Errorf("ssh-keygen -Y sign -f %s: %w", key, err)
	}
	if len(sig) == 0 {
		return errors.New("ssh-keygen -Y sign wrote no signature")
	}
	path := filepath.Join(dir, SigFile)
	if err := os.WriteFile(path, sig, 0o644); err != nil {
		return err
	}
	if err := checkSig(dir, fp); err != nil {
		_ = os.Remove(path)
		return err
	}
	return nil
}

// checkSig checks dir/SigFile against dir/SHA256SUMS and the key
// fingerprint fp (what a verifier checks, less the signer's identity).
func checkSig(dir, fp string) error {
	sums, err := os.Open(filepath.Join(dir, "SHA256SUMS"))
	if err != nil {
		return err
	}
	defer func() { _ = sums.Close() }()
	cmd := exec.Command("ssh-keygen", "-Y", "check-novalidate", "-n", SigNamespace, "-s", filepath.Join(dir, SigFile))
	cmd.Stdin = sums
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("the new signature does not check (ssh-keygen -Y check-novalidate): %w: %s", err, bytes.TrimSpace(out))
	}
	// `Good "file" signature with ED25519 key SHA256:...`
	if !strings.HasSuffix(strings.TrimSpace(string(out)), " key "+fp) {
		return fmt.Errorf("the new signature is not by key %s: %s", fp, bytes.TrimSpace(out))
	}
	return nil
}
