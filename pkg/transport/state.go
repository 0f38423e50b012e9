package transport

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"math/big"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/quic-go/quic-go"
)

// File names inside a server state directory.
const (
	CertFileName      = "cert.pem"
	KeyFileName       = "key.pem"
	ResetKeyFileName  = "stateless-reset.key"
	TicketKeyFileName = "session-ticket.key"
	TokenKeyFileName  = "address-token.key"
)

// ServerName is the DNS name put into generated certificates.
const ServerName = "quictun-server"

// ErrBadFingerprint is returned for a fingerprint that is not 32 hex-encoded bytes.
var ErrBadFingerprint = errors.New("fingerprint must be sha256:<64 hex digits>")

// State is the server identity and the keys that must stay stable across restarts:
// the stateless-reset key lets a restarted server tell clients at once that their
// old connection is gone, and the session-ticket key lets them resume with 0-RTT.
type State struct {
	Cert      tls.Certificate
	ResetKey  quic.StatelessResetKey
	TicketKey [32]byte
	TokenKey  quic.TokenGeneratorKey
	// Generated reports whether the certificate was created by LoadOrCreateState.
	Generated bool
}

// Fingerprint returns the SHA-256 fingerprint of the leaf certificate.
func (s *State) Fingerprint() string { return Fingerprint(s.Cert.Certificate[0]) }

// privateStateFiles are the files of a state directory that hold secrets.
var privateStateFiles = []string{KeyFileName, ResetKeyFileName, TicketKeyFileName, TokenKeyFileName}

// CheckState refuses, with CheckPrivate, an existing state directory or key
// file of it (and keyFile, the --key-file, when set) that group or others
// may access. It creates nothing; missing files are not an error. Every
// problem is returned.
func CheckState(dir, keyFile string) error {
	var errs []error
	if keyFile != "" {
		errs = append(errs, CheckPrivate("--key-file", keyFile))
	}
	if dir != "" {
		errs = append(errs, CheckPrivate("--state-dir", dir))
		for _, f := range privateStateFiles {
			errs = append(errs, CheckPrivate("--state-dir key file", filepath.Join(dir, f)))
		}
	}
	return errors.Join(errs...)
}

// LoadOrCreateState reads the server state from dir, creating whatever is missing:
// a self-signed ECDSA P-256 certificate and random keys. Files are written with
// mode 0600 in a directory of mode 0700. When certFile is non-empty that
// certificate and keyFile are used instead of the generated one. An existing
// directory or key file that group or others may access is refused
// (CheckState).
func LoadOrCreateState(dir, certFile, keyFile string) (*State, error) {
	kf := ""
	if certFile != "" {
		kf = keyFile
	}
	if err := CheckState(dir, kf); err != nil {
		return nil, err
	}
	_, statErr := os.Stat(dir)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("state dir: %w", err)
	}
	if errors.Is(statErr, fs.ErrNotExist) {
		if err := makePrivate(dir, true); err != nil { // Windows: not the parent's ACL
			return nil, fmt.Errorf("state dir: %w", err)
		}
	}
	s := &State{}
	var err error
	if certFile != "" {
		if s.Cert, err = tls.LoadX509KeyPair(certFile, keyFile); err != nil {
			return nil, fmt.Errorf("load certificate %s: %w", certFile, err)
		}
	} else {
		cf, kf := filepath.Join(dir, CertFileName), filepath.Join(dir, KeyFileName)
		s.Cert, err = tls.LoadX509KeyPair(cf, kf)
		if errors.Is(err, os.ErrNotExist) {
			if err = generateCert(cf, kf); err != nil {
				return nil, err
			}
			s.Generated = true
			s.Cert, err = tls.LoadX509KeyPair(cf, kf)
		}
		if err != nil {
			return nil, fmt.Errorf("load generated certificate in %s: %w", dir, err)
		}
	}
	for _, k := range []struct {
		name string
		buf  []byte
	}{
		{ResetKeyFileName, s.ResetKey[:]},
		{TicketKeyFileName, s.TicketKey[:]},
		{TokenKeyFileName, s.TokenKey[:]},
	} {
		if err := loadOrCreateKey(filepath.Join(dir, k.name), k.buf); err != nil {
			return nil, err
		}
	}
	return s, nil
}

// LoadCertificate reads the server certificate LoadOrCreateState would use,
// without creating anything: certFile and keyFile when certFile is set, else
// the certificate in dir. A key file that group or others may access is
// refused (CheckPrivate). For a reload of the certificate.
func LoadCertificate(dir, certFile, keyFile string) (tls.Certificate, error) {
	if certFile == "" {
		certFile, keyFile = filepath.Join(dir, CertFileName), filepath.Join(dir, KeyFileName)
		if err := CheckPrivate("--state-dir key file", keyFile); err != nil {
			return tls.Certificate{}, err
		}
	} else if err := CheckPrivate("--key-file", keyFile); err != nil {
		return tls.Certificate{}, err
	}
	c, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("load certificate %s: %w", certFile, err)
	}
	return c, nil
}

func loadOrCreateKey(path string, key []byte) error {
	b, err := os.ReadFile(path)
	if err == nil {
		raw, derr := hex.DecodeString(strings.TrimSpace(string(b)))
		if derr != nil || len(raw) != len(key) {
			return fmt.Errorf("key file %s: want %d hex-encoded bytes", path, len(key))
		}
		copy(key, raw)
		return nil
	}
	if !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("key file: %w", err)
	}
	if _, err := rand.Read(key); err != nil {
		return fmt.Errorf("generate key: %w", err)
	}
	return writeFileAtomic(path, []byte(hex.EncodeToString(key)+"\n"))
}

func generateCert(certFile, keyFile string) error {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return fmt.Errorf("generate key: %w", err)
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return fmt.Errorf("serial: %w", err)
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: ServerName},
		DNSNames:              []string{ServerName},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.AddDate(10, 0, 0),
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
		IsCA:                  true, // self-signed: usable as its own --ca-file
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return fmt.Errorf("create certificate: %w", err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return fmt.Errorf("marshal key: %w", err)
	}
	if err := writeFileAtomic(keyFile, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER})); err != nil {
		return err
	}
	return writeFileAtomic(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}))
}

func writeFileAtomic(path string, data []byte) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), ".tmp-*")
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	defer func() { _ = os.Remove(tmp.Name()) }()
	if err := tmp.Chmod(0o600); err != nil {
		_ = tmp.Close()
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := makePrivate(tmp.Name(), false); err != nil { // Windows: an ACL of its own, kept by the rename
		_ = tmp.Close()
		return fmt.Errorf("write %s: %w", path, err)
	}
	if _, err := tmp.Write(data); err != nil {
		_ = tmp.Close()
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}

// Fingerprint returns "sha256:<hex>" of a DER certificate.
func Fingerprint(der []byte) string {
	sum := sha256.Sum256(der)
	return "sha256:" + hex.EncodeToString(sum[:])
}

// ParseFingerprint accepts "sha256:<hex>", plain hex, and colon-separated hex.
func ParseFingerprint(s string) ([32]byte, error) {
	var out [32]byte
	s = strings.TrimPrefix(strings.ToLower(strings.TrimSpace(s)), "sha256:")
	s = strings.ReplaceAll(s, ":", "")
	raw, err := hex.DecodeString(s)
	if err != nil || len(raw) != len(out) {
		return out, ErrBadFingerprint
	}
	copy(out[:], raw)
	return out, nil
}
