package cli

import (
	"crypto/tls"
	"errors"
	"fmt"
	"os"

	"github.com/quictun/quictun/pkg/transport"
)

// StartFiles names the files a daemon reads at start, by the flag that names them.
type StartFiles struct {
	SecretFile     string // --secret-file
	HTTPDTokenFile string // --httpd-token-file
	CAFlag, CAFile string // --ca-file or --client-ca-file
	CertFile       string // --cert-file
	KeyFile        string // --key-file
}

// CheckStartFiles reads the files the daemon reads at start, for
// --check-config, and returns every problem. A file that does not exist here
// is skipped: configs are often checked on another host than they are for.
func CheckStartFiles(f StartFiles) []error {
	var errs []error
	if Present(f.SecretFile) {
		if _, err := ReadSecretFile("secret-file", f.SecretFile, 16); err != nil {
			errs = append(errs, err)
		}
	}
	if Present(f.HTTPDTokenFile) {
		if _, err := ReadSecretFile("httpd-token-file", f.HTTPDTokenFile, 16); err != nil {
			errs = append(errs, err)
		}
	}
	if Present(f.CAFile) {
		if _, err := transport.LoadCertPool(f.CAFile); err != nil {
			errs = append(errs, fmt.Errorf("--%s: %w", f.CAFlag, err))
		}
	}
	if Present(f.CertFile) {
		if _, err := tls.LoadX509KeyPair(f.CertFile, f.KeyFile); err != nil {
			errs = append(errs, fmt.Errorf("--cert-file/--key-file: %w", err))
		}
	}
	return errs
}

// Present reports whether path is set and exists (or cannot be checked).
func Present(path string) bool {
	if path == "" {
		return false
	}
	_, err := os.Stat(path)
	return !errors.Is(err, os.ErrNotExist)
}
