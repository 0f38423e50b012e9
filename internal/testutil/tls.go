package testutil

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// SelfSignedTLS returns TLS configs for a bare quic-go server and client
// (no quictun identity): a self-signed ECDSA certificate for name, trusted by
// the client, with ALPN name. The certificate is valid from 1990 to 2090, so it
// also works inside a testing/synctest bubble, whose clock starts in 2000.
func SelfSignedTLS(tb testing.TB, name string) (server, client *tls.Config) {
	tb.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(tb, err)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: name}, DNSNames: []string{name},
		NotBefore: time.Date(1990, 1, 1, 0, 0, 0, 0, time.UTC), NotAfter: time.Date(2090, 1, 1, 0, 0, 0, 0, time.UTC),
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	require.NoError(tb, err)
	cert, err := x509.ParseCertificate(der)
	require.NoError(tb, err)
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	server = &tls.Config{Certificates: []tls.Certificate{{Certificate: [][]byte{der}, PrivateKey: key}}, NextProtos: []string{name}}
	client = &tls.Config{RootCAs: pool, ServerName: name, NextProtos: []string{name}}
	return server, client
}

// ClientCA returns a client CA's pool (for a server's --client-ca-file) and a
// function that issues a client certificate with common name cn from it.
func ClientCA(tb testing.TB) (*x509.CertPool, func(cn string) tls.Certificate) {
	tb.Helper()
	ca := newClientCA(tb)
	pool := x509.NewCertPool()
	pool.AddCert(ca.cert)
	return pool, func(cn string) tls.Certificate {
		der, key := ca.issue(tb, cn)
		return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
	}
}

// ClientCAFiles is ClientCA as PEM files for the built daemons: the CA's
// certificate (a server's --client-ca-file) in a new temp dir, and a function
// that issues a client certificate with common name cn as a --cert-file and a
// --key-file (mode 0600) beside it.
func ClientCAFiles(tb testing.TB) (caFile string, issue func(cn string) (certFile, keyFile string)) {
	tb.Helper()
	ca := newClientCA(tb)
	dir := tb.TempDir()
	write := func(name, typ string, der []byte) string {
		p := filepath.Join(dir, name)
		require.NoError(tb, os.WriteFile(p, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600))
		return p
	}
	caFile = write("ca.pem", "CERTIFICATE", ca.cert.Raw)
	return caFile, func(cn string) (string, string) {
		der, key := ca.issue(tb, cn)
		keyDER, err := x509.MarshalPKCS8PrivateKey(key)
		require.NoError(tb, err)
		return write(cn+".pem", "CERTIFICATE", der), write(cn+"-key.pem", "PRIVATE KEY", keyDER)
	}
}

// ServerCA returns a CA's pool (a client's --ca-file) and a server
// certificate it signed for hosts (DNS names or IP addresses).
func ServerCA(tb testing.TB, hosts ...string) (*x509.CertPool, tls.Certificate) {
	tb.Helper()
	ca := newClientCA(tb)
	pool := x509.NewCertPool()
	pool.AddCert(ca.cert)
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(tb, err)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: hosts[0]},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	require.NoError(tb, err)
	return pool, tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

// clientCA is a test CA that issues client certificates (and, ServerCA, a
// server certificate).
type clientCA struct {
	cert   *x509.Certificate
	key    *ecdsa.PrivateKey
	mu     sync.Mutex
	serial int64
}

func newClientCA(tb testing.TB) *clientCA {
	tb.Helper()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(tb, err)
	caTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test client CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageCertSign, BasicConstraintsValid: true, IsCA: true,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	require.NoError(tb, err)
	ca, err := x509.ParseCertificate(caDER)
	require.NoError(tb, err)
	return &clientCA{cert: ca, key: caKey, serial: 1}
}

// issue returns a client certificate for cn (subject CN=cn,O=quictun tests)
// and its key.
func (ca *clientCA) issue(tb testing.TB, cn string) ([]byte, *ecdsa.PrivateKey) {
	tb.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(tb, err)
	ca.mu.Lock()
	ca.serial++
	serial := ca.serial
	ca.mu.Unlock()
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: cn, Organization: []string{"quictun tests"}},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	require.NoError(tb, err)
	return der, key
}
