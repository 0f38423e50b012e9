package transport_test

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
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quictun/quictun/pkg/transport"
)

var stateFiles = []string{
	transport.CertFileName, transport.KeyFileName, transport.ResetKeyFileName,
	transport.TicketKeyFileName, transport.TokenKeyFileName,
}

func newState(t *testing.T) (*transport.State, string) {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "state")
	st, err := transport.LoadOrCreateState(dir, "", "")
	require.NoError(t, err)
	return st, dir
}

func TestLoadOrCreateStateCreatesPrivateFilesAndReloads(t *testing.T) {
	t.Parallel()
	st, dir := newState(t)
	assert.True(t, st.Generated)

	fi, err := os.Stat(dir)
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o700), fi.Mode().Perm(), "state dir mode")
	for _, name := range stateFiles {
		fi, err := os.Stat(filepath.Join(dir, name))
		require.NoError(t, err, name)
		assert.Equal(t, os.FileMode(0o600), fi.Mode().Perm(), "%s mode", name)
	}
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	assert.Len(t, entries, len(stateFiles), "no temp files left behind")

	leaf, err := x509.ParseCertificate(st.Cert.Certificate[0])
	require.NoError(t, err)
	assert.Equal(t, []string{transport.ServerName}, leaf.DNSNames)
	assert.True(t, time.Now().Before(leaf.NotAfter))
	assert.NotEqual(t, [32]byte{}, st.TicketKey, "random ticket key")
	assert.NotEqual(t, st.TicketKey[:], st.ResetKey[:], "independent keys")

	again, err := transport.LoadOrCreateState(dir, "", "")
	require.NoError(t, err)
	assert.False(t, again.Generated)
	assert.Equal(t, st.Cert.Certificate, again.Cert.Certificate, "same identity")
	assert.Equal(t, st.Fingerprint(), again.Fingerprint())
	assert.Equal(t, st.ResetKey, again.ResetKey)
	assert.Equal(t, st.TicketKey, again.TicketKey)
	assert.Equal(t, st.TokenKey, again.TokenKey)

	other, _ := newState(t)
	assert.NotEqual(t, st.Fingerprint(), other.Fingerprint(), "a fresh dir gets a fresh identity")
	assert.NotEqual(t, st.ResetKey, other.ResetKey)
}

func TestLoadOrCreateStateCorruptFiles(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, file, content string
	}{
		{"reset key not hex", transport.ResetKeyFileName, "not hex at all\n"},
		{"ticket key too short", transport.TicketKeyFileName, hex.EncodeToString(make([]byte, 16))},
		{"token key too long", transport.TokenKeyFileName, hex.EncodeToString(make([]byte, 64))},
		{"empty key", transport.ResetKeyFileName, ""},
		{"cert garbage", transport.CertFileName, "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n"},
		{"key garbage", transport.KeyFileName, "garbage"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, dir := newState(t)
			require.NoError(t, os.WriteFile(filepath.Join(dir, tc.file), []byte(tc.content), 0o600))
			_, err := transport.LoadOrCreateState(dir, "", "")
			require.Error(t, err)
			assert.Contains(t, err.Error(), dir, "error names the state")
		})
	}
}

func TestLoadOrCreateStateKeyWithWhitespace(t *testing.T) {
	t.Parallel()
	st, dir := newState(t)
	key := filepath.Join(dir, transport.TicketKeyFileName)
	require.NoError(t, os.WriteFile(key, []byte("  "+hex.EncodeToString(st.TicketKey[:])+"\r\n\n"), 0o600))
	again, err := transport.LoadOrCreateState(dir, "", "")
	require.NoError(t, err)
	assert.Equal(t, st.TicketKey, again.TicketKey)
}

func TestLoadOrCreateStateExternalCert(t *testing.T) {
	t.Parallel()
	src, srcDir := newState(t)
	dir := filepath.Join(t.TempDir(), "other")
	st, err := transport.LoadOrCreateState(dir,
		filepath.Join(srcDir, transport.CertFileName), filepath.Join(srcDir, transport.KeyFileName))
	require.NoError(t, err)
	assert.False(t, st.Generated)
	assert.Equal(t, src.Fingerprint(), st.Fingerprint())
	_, err = os.Stat(filepath.Join(dir, transport.CertFileName))
	assert.ErrorIs(t, err, os.ErrNotExist, "no certificate generated when one is given")

	_, err = transport.LoadOrCreateState(dir, filepath.Join(dir, "missing.pem"), filepath.Join(dir, "missing-key.pem"))
	require.Error(t, err)
	assert.ErrorIs(t, err, os.ErrNotExist)
}

func TestFingerprint(t *testing.T) {
	t.Parallel()
	der := []byte("not really a certificate")
	sum := sha256.Sum256(der)
	hexSum := hex.EncodeToString(sum[:])
	fp := transport.Fingerprint(der)
	assert.Equal(t, "sha256:"+hexSum, fp)

	colons := make([]string, len(sum))
	for i, b := range sum {
		colons[i] = strings.ToUpper(hex.EncodeToString([]byte{b}))
	}
	for _, tc := range []struct {
		name, in string
	}{
		{"canonical", fp},
		{"plain hex", hexSum},
		{"upper case", strings.ToUpper(fp)},
		{"colons upper", strings.Join(colons, ":")},
		{"prefix and colons", "sha256:" + strings.Join(colons, ":")},
		{"surrounding space", "  " + fp + "\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got, err := transport.ParseFingerprint(tc.in)
			require.NoError(t, err)
			assert.Equal(t, sum, got)
		})
	}
	for _, tc := range []struct {
		name, in string
	}{
		{"empty", ""},
		{"prefix only", "sha256:"},
		{"31 bytes", hexSum[:62]},
		{"33 bytes", hexSum + "00"},
		{"odd length", hexSum[:63]},
		{"not hex", strings.Repeat("zz", 32)},
		{"other algorithm", "sha1:" + hexSum},
	} {
		t.Run("bad/"+tc.name, func(t *testing.T) {
			t.Parallel()
			_, err := transport.ParseFingerprint(tc.in)
			assert.ErrorIs(t, err, transport.ErrBadFingerprint)
		})
	}
}

func TestClientTLSConfigNeedsVerification(t *testing.T) {
	t.Parallel()
	_, err := transport.ClientTLSConfig(transport.ClientTLSOptions{})
	require.ErrorIs(t, err, transport.ErrNoServerVerification)

	cert := tls.Certificate{}
	_, err = transport.ClientTLSConfig(transport.ClientTLSOptions{ClientCert: &cert, ServerName: "x"})
	require.ErrorIs(t, err, transport.ErrNoServerVerification, "a client cert alone does not verify the server")

	c, err := transport.ClientTLSConfig(transport.ClientTLSOptions{InsecureSkipVerify: true, ClientCert: &cert})
	require.NoError(t, err)
	assert.True(t, c.InsecureSkipVerify)
	assert.Equal(t, uint16(tls.VersionTLS13), c.MinVersion)
	assert.Equal(t, []string{transport.ALPN}, c.NextProtos)
	assert.Len(t, c.Certificates, 1)
}

// connPair returns both ends of a loopback TCP connection. Unlike net.Pipe it
// buffers, so a side that fails mid-flight can send its alert without the
// peer reading, and a failing handshake ends at once instead of at a deadline.
func connPair(t *testing.T) (a, b net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer func() { _ = ln.Close() }()
	ch := make(chan net.Conn, 1)
	go func() {
		c, _ := ln.Accept()
		ch <- c
	}()
	b, err = net.Dial("tcp", ln.Addr().String())
	require.NoError(t, err)
	a = <-ch
	require.NotNil(t, a)
	return a, b
}

// handshake runs a TLS handshake over loopback TCP and returns both sides'
// errors and the client's connection state.
func handshake(t *testing.T, server, client *tls.Config) (cs tls.ConnectionState, serr, cerr error) {
	t.Helper()
	sc, cc := connPair(t)
	defer func() { _ = sc.Close() }()
	defer func() { _ = cc.Close() }()
	deadline := time.Now().Add(10 * time.Second)
	require.NoError(t, sc.SetDeadline(deadline))
	require.NoError(t, cc.SetDeadline(deadline))
	s := tls.Server(sc, server)
	c := tls.Client(cc, client)
	done := make(chan error, 1)
	go func() {
		err := s.Handshake()
		if err == nil {
			// In TLS 1.3 the server verifies the client certificate after the
			// client has finished; read to get that result.
			if _, err = s.Read(make([]byte, 1)); err == nil {
				_, err = s.Write([]byte{2})
			}
		}
		if err != nil {
			_ = sc.Close()
		}
		done <- err
	}()
	cerr = c.Handshake()
	if cerr == nil {
		if _, cerr = c.Write([]byte{1}); cerr == nil {
			_, cerr = c.Read(make([]byte, 1)) // a rejected client certificate shows here
		}
		cs = c.ConnectionState()
	}
	if cerr != nil {
		_ = cc.Close()
	}
	serr = <-done
	return cs, serr, cerr
}

func TestPinnedHandshake(t *testing.T) {
	t.Parallel()
	st, _ := newState(t)
	other, _ := newState(t)
	zero := "sha256:" + strings.Repeat("00", 32)
	for _, tc := range []struct {
		name    string
		pins    []string
		wantErr bool
	}{
		{"right fingerprint", []string{st.Fingerprint()}, false},
		{"another server's fingerprint", []string{other.Fingerprint()}, true},
		{"zero fingerprint", []string{zero}, true},
		{"right one among several (rotation)", []string{other.Fingerprint(), st.Fingerprint()}, false},
		{"none of several", []string{other.Fingerprint(), zero}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var pins [][32]byte
			for _, p := range tc.pins {
				pin, err := transport.ParseFingerprint(p)
				require.NoError(t, err)
				pins = append(pins, pin)
			}
			ccfg, err := transport.ClientTLSConfig(transport.ClientTLSOptions{Fingerprints: pins})
			require.NoError(t, err)
			cs, serr, cerr := handshake(t, transport.ServerTLSConfig(st, nil), ccfg)
			if tc.wantErr {
				require.ErrorIs(t, cerr, transport.ErrFingerprintMismatch)
				var pm *transport.PinMismatchError
				require.ErrorAs(t, cerr, &pm)
				assert.Equal(t, st.Fingerprint(), pm.Presented, "the error names the certificate presented")
				assert.Error(t, serr)
				return
			}
			require.NoError(t, cerr)
			require.NoError(t, serr)
			assert.Equal(t, transport.ALPN, cs.NegotiatedProtocol)
			assert.Equal(t, uint16(tls.VersionTLS13), cs.Version)
		})
	}
}

func TestCAVerifiedHandshake(t *testing.T) {
	t.Parallel()
	st, dir := newState(t)
	pool, err := transport.LoadCertPool(filepath.Join(dir, transport.CertFileName))
	require.NoError(t, err)
	for _, tc := range []struct {
		name, serverName string
		wantErr          bool
	}{
		{"matching name", transport.ServerName, false},
		{"wrong name", "example.com", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ccfg, err := transport.ClientTLSConfig(transport.ClientTLSOptions{RootCAs: pool, ServerName: tc.serverName})
			require.NoError(t, err)
			_, _, cerr := handshake(t, transport.ServerTLSConfig(st, nil), ccfg)
			if tc.wantErr {
				var he x509.HostnameError
				assert.ErrorAs(t, cerr, &he)
				return
			}
			assert.NoError(t, cerr)
		})
	}
}

// clientCA returns a CA pool and a client certificate it signed.
func clientCA(t *testing.T) (*x509.CertPool, tls.Certificate) {
	t.Helper()
	return clientCAValid(t, time.Now().Add(-time.Hour), time.Now().Add(time.Hour))
}

// clientCAValid is clientCA with the client certificate valid from notBefore
// to notAfter (the CA itself is valid from 3 days ago to 3 days ahead).
func clientCAValid(t *testing.T, notBefore, notAfter time.Time) (*x509.CertPool, tls.Certificate) {
	t.Helper()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	caTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test client CA"},
		NotBefore: time.Now().Add(-72 * time.Hour), NotAfter: time.Now().Add(72 * time.Hour),
		KeyUsage: x509.KeyUsageCertSign, BasicConstraintsValid: true, IsCA: true,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	require.NoError(t, err)
	ca, err := x509.ParseCertificate(caDER)
	require.NoError(t, err)
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "client"},
		NotBefore: notBefore, NotAfter: notAfter,
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	require.NoError(t, err)
	pool := x509.NewCertPool()
	pool.AddCert(ca)
	return pool, tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

func TestMutualTLS(t *testing.T) {
	t.Parallel()
	st, _ := newState(t)
	pool, good := clientCA(t)
	_, stranger := clientCA(t)
	for _, tc := range []struct {
		name    string
		cert    *tls.Certificate
		wantErr bool
	}{
		{"signed client certificate", &good, false},
		{"no client certificate", nil, true},
		{"certificate from another CA", &stranger, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ccfg, err := transport.ClientTLSConfig(transport.ClientTLSOptions{InsecureSkipVerify: true, ClientCert: tc.cert})
			require.NoError(t, err)
			scfg := transport.ServerTLSConfig(st, pool)
			assert.Equal(t, tls.RequireAndVerifyClientCert, scfg.ClientAuth)
			_, serr, cerr := handshake(t, scfg, ccfg)
			if tc.wantErr {
				assert.Error(t, serr, "server rejects the client")
				assert.Error(t, cerr, "client learns it was rejected")
				return
			}
			assert.NoError(t, serr)
			assert.NoError(t, cerr)
		})
	}
}

func TestServerTLSConfig(t *testing.T) {
	t.Parallel()
	st, _ := newState(t)
	c := transport.ServerTLSConfig(st, nil)
	assert.Equal(t, uint16(tls.VersionTLS13), c.MinVersion)
	assert.Equal(t, []string{transport.ALPN}, c.NextProtos)
	assert.Equal(t, tls.NoClientCert, c.ClientAuth)
	got, err := c.GetCertificate(&tls.ClientHelloInfo{})
	require.NoError(t, err)
	assert.Equal(t, st.Cert.Certificate, got.Certificate)
}

// TestServerCertificateReplaced: a server certificate replaced while the
// server runs is presented from the next handshake on, and a client pinning
// only the new one verifies it.
func TestServerCertificateReplaced(t *testing.T) {
	t.Parallel()
	oldSt, _ := newState(t)
	newSt, _ := newState(t)
	cert := transport.NewServerCertificate(oldSt.Cert)
	scfg := transport.ServerTLSConfigFor(cert, oldSt.TicketKey, nil)
	pin := func(st *transport.State) [32]byte {
		p, err := transport.ParseFingerprint(st.Fingerprint())
		require.NoError(t, err)
		return p
	}
	client := func(pins ...[32]byte) *tls.Config {
		c, err := transport.ClientTLSConfig(transport.ClientTLSOptions{Fingerprints: pins})
		require.NoError(t, err)
		return c
	}
	cs, serr, cerr := handshake(t, scfg, client(pin(oldSt)))
	require.NoError(t, serr)
	require.NoError(t, cerr)
	assert.Equal(t, oldSt.Cert.Certificate[0], cs.PeerCertificates[0].Raw)

	cert.Store(newSt.Cert)
	assert.Equal(t, newSt.Fingerprint(), cert.Fingerprint())
	cs, serr, cerr = handshake(t, scfg, client(pin(newSt)))
	require.NoError(t, serr)
	require.NoError(t, cerr)
	assert.Equal(t, newSt.Cert.Certificate[0], cs.PeerCertificates[0].Raw, "the new certificate from the next handshake")
	_, _, cerr = handshake(t, scfg, client(pin(oldSt)))
	require.ErrorIs(t, cerr, transport.ErrFingerprintMismatch, "a client pinning only the old one refuses it")
}

// TestLoadCertificate: the certificate a reload reads, from --cert-file or
// the state dir, without creating anything; a key others may read is
// refused as at start.
func TestLoadCertificate(t *testing.T) {
	t.Parallel()
	st, dir := newState(t)
	c, err := transport.LoadCertificate(dir, "", "")
	require.NoError(t, err)
	assert.Equal(t, st.Cert.Certificate, c.Certificate)

	certFile, keyFile := filepath.Join(dir, transport.CertFileName), filepath.Join(dir, transport.KeyFileName)
	c, err = transport.LoadCertificate("", certFile, keyFile)
	require.NoError(t, err)
	assert.Equal(t, st.Cert.Certificate, c.Certificate)

	empty := t.TempDir()
	_, err = transport.LoadCertificate(empty, "", "")
	require.ErrorIs(t, err, os.ErrNotExist)
	_, err = os.Stat(filepath.Join(empty, transport.CertFileName))
	require.ErrorIs(t, err, os.ErrNotExist, "nothing created")

	require.NoError(t, os.Chmod(keyFile, 0o644))
	_, err = transport.LoadCertificate(dir, "", "")
	require.ErrorIs(t, err, transport.ErrLoosePermissions)
	_, err = transport.LoadCertificate("", certFile, keyFile)
	require.ErrorIs(t, err, transport.ErrLoosePermissions)
}

func TestStickySessionCacheKeepsTicketOnDelete(t *testing.T) {
	t.Parallel()
	cs := &tls.ClientSessionState{}

	// Plain crypto/tls behaviour: Put(key, nil) deletes.
	lru := tls.NewLRUClientSessionCache(2)
	lru.Put("k", cs)
	lru.Put("k", nil)
	_, ok := lru.Get("k")
	require.False(t, ok, "precondition: the LRU cache deletes on nil")

	c := transport.NewStickySessionCache(2)
	c.Put("k", cs)
	c.Put("k", nil)
	got, ok := c.Get("k")
	require.True(t, ok, "ticket kept after a nil Put")
	assert.Same(t, cs, got)

	newer := &tls.ClientSessionState{}
	c.Put("k", newer)
	got, _ = c.Get("k")
	assert.Same(t, newer, got, "a new ticket replaces the old one")

	c.Put("a", cs)
	c.Put("b", cs)
	_, ok = c.Get("k")
	assert.False(t, ok, "capacity is honoured")
}

func TestQUICConfig(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		o    transport.QUICOptions
	}{
		{"defaults", transport.DefaultQUICOptions()},
		{"custom", transport.QUICOptions{
			IdleTimeout: 7 * time.Second, KeepAlivePeriod: time.Second, HandshakeTimeout: 2 * time.Second,
			MaxIncomingStreams: 3, Allow0RTT: false,
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			c := transport.QUICConfig(tc.o)
			assert.Equal(t, tc.o.IdleTimeout, c.MaxIdleTimeout)
			assert.Equal(t, tc.o.KeepAlivePeriod, c.KeepAlivePeriod)
			assert.Equal(t, tc.o.HandshakeTimeout, c.HandshakeIdleTimeout)
			assert.Equal(t, tc.o.MaxIncomingStreams, c.MaxIncomingStreams)
			assert.Equal(t, tc.o.Allow0RTT, c.Allow0RTT)
			assert.True(t, c.EnableDatagrams, "liveness datagrams need RFC 9221")
			assert.Equal(t, int64(-1), c.MaxIncomingUniStreams, "no unidirectional streams")
			assert.LessOrEqual(t, c.InitialStreamReceiveWindow, c.MaxStreamReceiveWindow)
			assert.LessOrEqual(t, c.InitialConnectionReceiveWindow, c.MaxConnectionReceiveWindow)
			assert.LessOrEqual(t, c.MaxStreamReceiveWindow, c.MaxConnectionReceiveWindow)
		})
	}
	d := transport.DefaultQUICOptions()
	assert.Less(t, d.KeepAlivePeriod, d.IdleTimeout)
	assert.True(t, d.Allow0RTT)
}

func TestListenUDP(t *testing.T) {
	t.Parallel()
	c, err := transport.ListenUDP("127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	assert.True(t, c.LocalAddr().(*net.UDPAddr).IP.IsLoopback())

	_, err = transport.ListenUDP("no-port")
	assert.Error(t, err)
}

func TestLoadCertPool(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	_, err := transport.LoadCertPool(filepath.Join(dir, "missing.pem"))
	require.ErrorIs(t, err, os.ErrNotExist)

	notPEM := filepath.Join(dir, "x.pem")
	require.NoError(t, os.WriteFile(notPEM, []byte("hello"), 0o600))
	_, err = transport.LoadCertPool(notPEM)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "no PEM certificates")

	_, sdir := newState(t)
	b, err := os.ReadFile(filepath.Join(sdir, transport.CertFileName))
	require.NoError(t, err)
	blk, _ := pem.Decode(b)
	require.NotNil(t, blk)
	pool, err := transport.LoadCertPool(filepath.Join(sdir, transport.CertFileName))
	require.NoError(t, err)
	assert.NotNil(t, pool)
}

// TestClientCAsReplaced: client CAs replaced while the server runs apply
// from the next handshake on, to resumed sessions too: a client of a
// removed CA neither makes a full handshake nor resumes the session it has
// a ticket for, and a client of the new CA is accepted.
func TestClientCAsReplaced(t *testing.T) {
	t.Parallel()
	st, _ := newState(t)
	poolA, certA := clientCA(t)
	poolB, certB := clientCA(t)
	cas := transport.NewClientCAs(poolA)
	scfg := transport.ServerTLSConfigFor(transport.NewServerCertificate(st.Cert), st.TicketKey, cas)
	assert.Equal(t, tls.RequireAndVerifyClientCert, scfg.ClientAuth)
	client := func(cert tls.Certificate, cache tls.ClientSessionCache) *tls.Config {
		c, err := transport.ClientTLSConfig(transport.ClientTLSOptions{ServerName: "server.test", InsecureSkipVerify: true, ClientCert: &cert, SessionCache: cache})
		require.NoError(t, err)
		return c
	}
	cacheA := tls.NewLRUClientSessionCache(4)
	_, serr, cerr := handshake(t, scfg, client(certA, cacheA))
	require.NoError(t, serr)
	require.NoError(t, cerr)
	cs, serr, cerr := handshake(t, scfg, client(certA, cacheA))
	require.NoError(t, serr)
	require.NoError(t, cerr)
	require.True(t, cs.DidResume, "the ticket resumes while CA A is in force")
	_, serr, cerr = handshake(t, scfg, client(certB, nil))
	require.Error(t, serr, "CA B is not trusted yet")
	require.Error(t, cerr)

	cas.Store(poolB)
	_, serr, cerr = handshake(t, scfg, client(certA, cacheA))
	assert.Error(t, serr, "a session of CA A no longer resumes, and a full handshake fails")
	assert.Error(t, cerr)
	_, serr, cerr = handshake(t, scfg, client(certB, nil))
	assert.NoError(t, serr)
	assert.NoError(t, cerr)
}

type handshakeChan chan struct{}

func (c handshakeChan) HandshakeComplete() <-chan struct{} { return c }

func TestHandshakeComplete(t *testing.T) {
	c := make(handshakeChan)
	require.False(t, transport.HandshakeComplete(c), "open: not complete, and no wait")
	close(c)
	require.True(t, transport.HandshakeComplete(c))
}
