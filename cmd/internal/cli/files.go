package cli

import (
	"crypto/tls"
	"fmt"

	"github.com/quictun/quictun/pkg/transport"
)

// StartFiles names the files a daemon reads at start, by the flag that names them.
type StartFiles struct {
	SecretFile     string // --secret-file
	KeysFile       string // --keys-file (server)
	HTTPDTokenFile string // --httpd-token-file
	CAFlag, CAFile string // --ca-file or --client-ca-file
	CertFile       string // --cert-file
	KeyFile        string // --key-file
	StateDir       string // --state-dir (server): checked, not created
	SessionFile    string // --session-file (client): may be missing
}

// CheckStartFiles reads the files the daemon reads at start, for
// --check-config, and returns every problem: a file that is missing or
// unreadable here, a short secret, a bad certificate, and a secret, key,
// session file or state dir of ours that group or others may access
// (transport.CheckPrivate). Run it on the host the config is for.
func CheckStartFiles(f StartFiles) []error {
	var errs []error
	if f.SecretFile != "" {
		if _, err := ReadSecretFile("secret-file", f.SecretFile, MinSecretLen); err != nil {
			errs = append(errs, err)
		}
	}
	if f.KeysFile != "" {
		if _, err := ReadKeysFile("keys-file", f.KeysFile); err != nil {
			errs = append(errs, err)
		}
	}
	if f.HTTPDTokenFile != "" {
		if _, err := ReadSecretFile("httpd-token-file", f.HTTPDTokenFile, 16); err != nil {
			errs = append(errs, err)
		}
	}
	if f.CAFile != "" {
		if _, err := transport.LoadCertPool(f.CAFile); err != nil {
			errs = append(errs, fmt.Errorf("--%s: %w", f.CAFlag, err))
		}
	}
	if f.CertFile != "" {
		if _, err := tls.LoadX509KeyPair(f.CertFile, f.KeyFile); err != nil {
			errs = append(errs, fmt.Errorf("--cert-file/--key-file: %w", err))
		}
	}
	keyFile := ""
	if f.CertFile != "" {
		keyFile = f.KeyFile
	}
	if err := transport.CheckState(f.StateDir, keyFile); err != nil {
		errs = append(errs, err)
	}
	if f.SessionFile != "" {
		if err := transport.CheckPrivate("--session-file", f.SessionFile); err != nil {
			errs = append(errs, err)
		}
	}
	return errs
}
