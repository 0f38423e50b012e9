package transport_test

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quictun/quictun/pkg/transport"
)

// writeCert writes a self-signed certificate for transport.ServerName, valid
// from notBefore to notAfter, and its key as PEM files in dir.
func writeCert(t *testing.T, dir string, notBefore, notAfter time.Time) (certFile, keyFile string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(7), Subject: pkix.Name{CommonName: transport.ServerName},
		DNSNames: []string{transport.ServerName}, NotBefore: notBefore, NotAfter: notAfter,
		KeyUsage: x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign, BasicConstraintsValid: true, IsCA: true,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	require.NoError(t, err)
	kder, err := x509.MarshalPKCS8PrivateKey(key)
	require.NoError(t, err)
	certFile, keyFile = filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	require.NoError(t, os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600))
	require.NoError(t, os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kder}), 0o600))
	return certFile, keyFile
}

// TestExpiredServerCertificate: a client verifying the server against a CA
// (--ca-file) refuses an expired or not yet valid certificate. A pinned
// certificate (--server-fingerprint) is trusted by its key, like an SSH host
// key: its dates do not matter, and SECURITY.md says so.
func TestExpiredServerCertificate(t *testing.T) {
	t.Parallel()
	now := time.Now()
	for _, tc := range []struct {
		name              string
		notBefore, notAft time.Time
	}{
		{"expired", now.Add(-48 * time.Hour), now.Add(-24 * time.Hour)},
		{"not yet valid", now.Add(24 * time.Hour), now.Add(48 * time.Hour)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			cert, key := writeCert(t, dir, tc.notBefore, tc.notAft)
			st, err := transport.LoadOrCreateState(filepath.Join(dir, "state"), cert, key)
			require.NoError(t, err)
			pool, err := transport.LoadCertPool(cert)
			require.NoError(t, err)

			ccfg, err := transport.ClientTLSConfig(transport.ClientTLSOptions{RootCAs: pool, ServerName: transport.ServerName})
			require.NoError(t, err)
			_, _, cerr := handshake(t, transport.ServerTLSConfig(st, nil), ccfg)
			var ie x509.CertificateInvalidError
			require.ErrorAs(t, cerr, &ie)
			assert.Equal(t, x509.Expired, ie.Reason)

			pin, err := transport.ParseFingerprint(st.Fingerprint())
			require.NoError(t, err)
			pcfg, err := transport.ClientTLSConfig(transport.ClientTLSOptions{Fingerprints: [][32]byte{pin}})
			require.NoError(t, err)
			_, _, cerr = handshake(t, transport.ServerTLSConfig(st, nil), pcfg)
			assert.NoError(t, cerr, "a pinned key is trusted whatever the dates")
		})
	}
}

// TestExpiredClientCertificate: with mutual TLS the server refuses a client
// certificate that has expired, although its CA signed it.
func TestExpiredClientCertificate(t *testing.T) {
	t.Parallel()
	st, _ := newState(t)
	pool, expired := clientCAValid(t, time.Now().Add(-48*time.Hour), time.Now().Add(-24*time.Hour))

	ccfg, err := transport.ClientTLSConfig(transport.ClientTLSOptions{InsecureSkipVerify: true, ClientCert: &expired})
	require.NoError(t, err)
	_, serr, cerr := handshake(t, transport.ServerTLSConfig(st, pool), ccfg)
	var ie x509.CertificateInvalidError
	require.ErrorAs(t, serr, &ie, "server: %v", serr)
	assert.Equal(t, x509.Expired, ie.Reason)
	assert.Error(t, cerr, "the client learns it was rejected")
}
