package deploy

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"errors"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gopkg.in/yaml.v3"

	"github.com/quictun/quictun/pkg/transport"
)

// manifest is one rendered Kubernetes object, decoded generically.
type manifest map[string]any

func (m manifest) kind() string { s, _ := m["kind"].(string); return s }

func (m manifest) name() string { return str(dig(m, "metadata", "name")) }

// dig walks maps by key and lists by int index; nil when a step is missing.
func dig(v any, path ...any) any {
	for _, p := range path {
		switch k := p.(type) {
		case string:
			switch mm := v.(type) {
			case map[string]any:
				v = mm[k]
			case manifest:
				v = mm[k]
			default:
				return nil
			}
		case int:
			l, ok := v.([]any)
			if !ok || k >= len(l) {
				return nil
			}
			v = l[k]
		}
	}
	return v
}

func str(v any) string { s, _ := v.(string); return s }

func helmTemplate(t *testing.T, helm string, args ...string) []manifest {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, helm, append([]string{"template", "quictun", deployPath(t, "helm", "quictun"), "--namespace", "quictun"}, args...)...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	require.NoError(t, err, "helm template %v: %s", args, stderr.String())
	var ms []manifest
	dec := yaml.NewDecoder(bytes.NewReader(out))
	for {
		var raw map[string]any // nested maps decode as map[string]any
		err := dec.Decode(&raw)
		if errors.Is(err, io.EOF) {
			break
		}
		require.NoError(t, err)
		if raw == nil {
			continue
		}
		m := manifest(raw)
		require.NotEmpty(t, m.kind(), "a document without kind")
		require.NotEmpty(t, m.name(), "a %s without name", m.kind())
		ms = append(ms, m)
	}
	return ms
}

func byKind(ms []manifest) map[string][]manifest {
	out := map[string][]manifest{}
	for _, m := range ms {
		out[m.kind()] = append(out[m.kind()], m)
	}
	return out
}

func find(t *testing.T, ms []manifest, kind, nameSuffix string) manifest {
	t.Helper()
	for _, m := range ms {
		if m.kind() == kind && strings.HasSuffix(m.name(), nameSuffix) {
			return m
		}
	}
	t.Fatalf("no %s named *%s", kind, nameSuffix)
	return nil
}

func TestHelmLint(t *testing.T) {
	t.Parallel()
	helm := lookTool(t, "helm")
	chart := deployPath(t, "helm", "quictun")
	valueFiles, err := filepath.Glob(filepath.Join(chart, "ci", "*-values.yaml"))
	require.NoError(t, err)
	require.NotEmpty(t, valueFiles)
	for _, f := range append([]string{""}, valueFiles...) {
		args := []string{"lint", "--strict", chart}
		if f != "" {
			args = append(args, "-f", f)
		}
		out, err := exec.Command(helm, args...).CombinedOutput()
		assert.NoError(t, err, "helm %v: %s", args, out)
	}
}

func TestHelmDefaultValues(t *testing.T) {
	t.Parallel()
	helm := lookTool(t, "helm")
	ms := helmTemplate(t, helm)
	kinds := byKind(ms)
	for kind, n := range map[string]int{
		"Deployment": 1, "Service": 3, "ConfigMap": 1, "Secret": 2, "ServiceAccount": 1, "PodDisruptionBudget": 1,
	} {
		assert.Len(t, kinds[kind], n, kind)
	}
	assert.Empty(t, kinds["ServiceMonitor"], "ServiceMonitor is off by default")
	assert.Empty(t, kinds["Job"], "the client example is off by default")

	// Issue 23: one name resolving to every ready replica, for clients of several servers.
	rs := find(t, ms, "Service", "-server-replicas")
	assert.Equal(t, "None", dig(rs, "spec", "clusterIP"), "headless")
	assert.Equal(t, false, dig(rs, "spec", "publishNotReadyAddresses"), "ready replicas only")
	assert.Equal(t, "UDP", dig(rs, "spec", "ports", 0, "protocol"))
	assert.Equal(t, "TCP", dig(rs, "spec", "ports", 1, "protocol"), "the TCP fallback (issue 24)")

	dep := find(t, ms, "Deployment", "-server")
	pod := dig(dep, "spec", "template", "spec")
	ctr := dig(pod, "containers", 0)
	assert.Equal(t, []any{"--config", "/etc/quictun/server.yaml"}, dig(ctr, "args"))
	assert.Equal(t, "/healthz", dig(ctr, "livenessProbe", "httpGet", "path"))
	assert.Equal(t, "/readyz", dig(ctr, "readinessProbe", "httpGet", "path"))
	assert.Equal(t, "admin", dig(ctr, "readinessProbe", "httpGet", "port"))
	assert.Equal(t, true, dig(ctr, "securityContext", "readOnlyRootFilesystem"))
	assert.Equal(t, false, dig(ctr, "securityContext", "allowPrivilegeEscalation"))
	assert.Equal(t, []any{"ALL"}, dig(ctr, "securityContext", "capabilities", "drop"))
	assert.Equal(t, true, dig(pod, "securityContext", "runAsNonRoot"))
	assert.NotNil(t, dig(ctr, "resources", "limits", "memory"))
	ports := map[string]string{}
	for _, p := range dig(ctr, "ports").([]any) {
		ports[str(dig(p, "name"))] = str(dig(p, "protocol"))
	}
	assert.Equal(t, map[string]string{"quic": "UDP", "quic-tcp": "TCP", "admin": "TCP"}, ports)
	// server.goDebug's default (docs/tuning.md), and nothing else in the environment.
	assert.Equal(t, []any{map[string]any{"name": "GODEBUG", "value": "schedtrace=2147483647"}}, dig(ctr, "env"))

	// The server config: the admin server on the pod IP needs the token, and it validates.
	cm := find(t, ms, "ConfigMap", "-server")
	cfgText := str(dig(cm, "data", "server.yaml"))
	require.NotEmpty(t, cfgText)
	assert.Equal(t, "0.0.0.0:8086", yamlScalar(t, []byte(cfgText), "httpd-listen-on"))
	assert.Equal(t, "/etc/quictun/auth/admin-token", yamlScalar(t, []byte(cfgText), "httpd-token-file"))
	assert.Equal(t, "/var/lib/quictun-server", yamlScalar(t, []byte(cfgText), "state-dir"))
	assert.Equal(t, "true", yamlScalar(t, []byte(cfgText), "audit-log"), "one audit line per tunnel by default")
	assert.NotContains(t, cfgText, "keys-file", "no named keys unless server.keys names a Secret")
	cfg := filepath.Join(t.TempDir(), "server.yaml")
	require.NoError(t, os.WriteFile(cfg, []byte(cfgText), 0o600))
	out, err := checkConfig(t, "quictun-server", "--config", cfg)
	require.NoError(t, err, "rendered server.yaml: %s", out)

	// terminationGracePeriodSeconds covers the drain.
	drain, err := time.ParseDuration(yamlScalar(t, []byte(cfgText), "drain-timeout"))
	require.NoError(t, err)
	grace, ok := dig(pod, "terminationGracePeriodSeconds").(int)
	require.True(t, ok)
	assert.Greater(t, time.Duration(grace)*time.Second, drain)

	// The Service carries QUIC and the TCP fallback on one port, and keeps
	// clients on one replica.
	svc := find(t, ms, "Service", "-server")
	assert.Equal(t, "LoadBalancer", dig(svc, "spec", "type"))
	assert.Equal(t, "UDP", dig(svc, "spec", "ports", 0, "protocol"))
	assert.Equal(t, "TCP", dig(svc, "spec", "ports", 1, "protocol"))
	assert.Equal(t, dig(svc, "spec", "ports", 0, "port"), dig(svc, "spec", "ports", 1, "port"))
	assert.NotContains(t, cfgText, "tcp-listen-on", "the server's default: TCP on the QUIC address")
	assert.Equal(t, "ClientIP", dig(svc, "spec", "sessionAffinity"))

	// The auth Secret: a shared secret and an admin token of at least 16 bytes.
	auth := find(t, ms, "Secret", "-auth")
	for _, k := range []string{"secret", "admin-token"} {
		b, err := base64.StdEncoding.DecodeString(str(dig(auth, "data", k)))
		require.NoError(t, err, k)
		assert.GreaterOrEqual(t, len(bytes.TrimSpace(b)), 16, k)
	}

	checkStateSecret(t, find(t, ms, "Secret", "-state"))
}

// checkStateSecret loads the chart-generated state the way every replica does,
// from a directory holding every file, and compares the fingerprint annotation.
func checkStateSecret(t *testing.T, sec manifest) {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "state")
	require.NoError(t, os.Mkdir(dir, 0o700))
	files := []string{transport.CertFileName, transport.KeyFileName, transport.ResetKeyFileName, transport.TicketKeyFileName, transport.TokenKeyFileName}
	data, ok := dig(sec, "data").(map[string]any)
	require.True(t, ok)
	require.Len(t, data, len(files))
	for _, f := range files {
		b, err := base64.StdEncoding.DecodeString(str(data[f]))
		require.NoError(t, err, f)
		require.NoError(t, os.WriteFile(filepath.Join(dir, f), b, 0o400))
	}
	st, err := transport.LoadOrCreateState(dir, "", "")
	require.NoError(t, err)
	assert.False(t, st.Generated, "the server must use the Secret's certificate, not generate one")
	assert.Equal(t, str(dig(sec, "metadata", "annotations", "quictun.io/fingerprint")), st.Fingerprint())
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	assert.Len(t, entries, len(files), "the server wrote into its (read-only) state directory")
	tlsHandshake(t, st.Cert, readFile(t, filepath.Join(dir, transport.CertFileName)))
	var zero [32]byte
	assert.NotEqual(t, zero, [32]byte(st.ResetKey))
	assert.NotEqual(t, zero, st.TicketKey)
	assert.NotEqual(t, st.ResetKey[:], st.TicketKey[:])
}

// TestHelmGoDebugServerOnly: server.goDebug's default reaches the server
// container and nothing else; the client sidecar (and the demo echo) get no
// GODEBUG.
func TestHelmGoDebugServerOnly(t *testing.T) {
	t.Parallel()
	helm := lookTool(t, "helm")
	ms := helmTemplate(t, helm, "--set", "clientExample.enabled=true", "--set", "demoEcho.enabled=true")
	srv := dig(find(t, ms, "Deployment", "-server"), "spec", "template", "spec", "containers", 0)
	assert.Equal(t, []any{map[string]any{"name": "GODEBUG", "value": "schedtrace=2147483647"}}, dig(srv, "env"))
	job := byKind(ms)["Job"]
	require.Len(t, job, 1)
	side := dig(job[0], "spec", "template", "spec", "initContainers", 0)
	assert.Equal(t, "quictun-client", dig(side, "name"))
	assert.Nil(t, dig(side, "env"), "the client sidecar gets no GODEBUG")
	assert.Nil(t, dig(job[0], "spec", "template", "spec", "containers", 0, "env"))
}

// TestHelmTCPFallbackOff: server.tcpFallback=false turns the server's TCP
// listener off (--tcp-listen-on=off in its config, which validates) and
// publishes UDP only.
func TestHelmTCPFallbackOff(t *testing.T) {
	t.Parallel()
	helm := lookTool(t, "helm")
	ms := helmTemplate(t, helm, "--set", "server.tcpFallback=false")
	cfgText := str(dig(find(t, ms, "ConfigMap", "-server"), "data", "server.yaml"))
	assert.Equal(t, "off", yamlScalar(t, []byte(cfgText), "tcp-listen-on"))
	cfg := filepath.Join(t.TempDir(), "server.yaml")
	require.NoError(t, os.WriteFile(cfg, []byte(cfgText), 0o600))
	out, err := checkConfig(t, "quictun-server", "--config", cfg)
	require.NoError(t, err, "rendered server.yaml: %s", out)
	for _, name := range []string{"-server", "-server-replicas"} {
		ports := dig(find(t, ms, "Service", name), "spec", "ports").([]any)
		require.Len(t, ports, 1, name)
		assert.Equal(t, "UDP", dig(ports[0], "protocol"), name)
	}
	ctr := dig(find(t, ms, "Deployment", "-server"), "spec", "template", "spec", "containers", 0)
	assert.Len(t, dig(ctr, "ports").([]any), 2, "quic and admin")
}

func TestHelmFullValues(t *testing.T) {
	t.Parallel()
	helm := lookTool(t, "helm")
	ms := helmTemplate(t, helm, "-f", deployPath(t, "helm", "quictun", "ci", "full-values.yaml"))
	kinds := byKind(ms)
	assert.Len(t, kinds["ServiceMonitor"], 1)
	assert.Len(t, kinds["Job"], 1)
	assert.Len(t, kinds["Deployment"], 2, "server and demo echo")

	svc := find(t, ms, "Service", "-server")
	assert.Equal(t, "NodePort", dig(svc, "spec", "type"))
	assert.Equal(t, 30750, dig(svc, "spec", "ports", 0, "nodePort"))
	assert.Equal(t, 2, dig(find(t, ms, "PodDisruptionBudget", "-server"), "spec", "minAvailable"))
	dep := find(t, ms, "Deployment", "-server")
	assert.Equal(t, 3, dig(dep, "spec", "replicas"))
	assert.Equal(t, "registry.example.com/quictun@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
		dig(dep, "spec", "template", "spec", "containers", 0, "image"))
	assert.Equal(t, 5, dig(dep, "spec", "template", "spec", "containers", 0, "lifecycle", "preStop", "sleep", "seconds"))
	assert.Nil(t, dig(dep, "spec", "template", "spec", "containers", 0, "env"), `server.goDebug "" leaves GODEBUG unset`)

	cfgText := str(dig(find(t, ms, "ConfigMap", "-server"), "data", "server.yaml"))
	assert.Contains(t, cfgText, "max-streams-per-conn: 20000")
	echoToken := "tcp:quictun-echo.quictun.svc.cluster.local:15676"
	assert.Contains(t, cfgText, "echo="+echoToken)
	assert.Contains(t, cfgText, "deny:\n- tcp:10.0.0.1:22", "server.deny becomes the config's deny list")
	assert.Contains(t, cfgText, "allow-for:\n- key=ci=tcp:10.0.0.5:5432", "server.allowFor becomes the config's allow-for list")
	assert.Equal(t, "false", yamlScalar(t, []byte(cfgText), "audit-log"))
	assert.Equal(t, "/etc/quictun/keys/keys", yamlScalar(t, []byte(cfgText), "keys-file"))
	// The keys Secret is mounted as a directory (a subPath mount would never
	// see a changed Secret, so a reload could not rotate keys).
	podSpec := dig(dep, "spec", "template", "spec")
	var keysMount any
	for _, m := range dig(podSpec, "containers", 0, "volumeMounts").([]any) {
		if str(dig(m, "name")) == "keys" {
			keysMount = m
		}
	}
	require.NotNil(t, keysMount, "no keys volume mount")
	assert.Equal(t, "/etc/quictun/keys", dig(keysMount, "mountPath"))
	assert.Nil(t, dig(keysMount, "subPath"))
	for _, v := range dig(podSpec, "volumes").([]any) {
		if str(dig(v, "name")) == "keys" {
			assert.Equal(t, "quictun-keys", dig(v, "secret", "secretName"))
			assert.Equal(t, []any{map[string]any{"key": "keys", "path": "keys"}}, dig(v, "secret", "items"))
		}
	}
	cfg := filepath.Join(t.TempDir(), "server.yaml")
	require.NoError(t, os.WriteFile(cfg, []byte(cfgText), 0o600))
	out, err := checkConfig(t, "quictun-server", "--config", cfg)
	require.NoError(t, err, "rendered server.yaml: %s", out)

	// The ServiceMonitor scrapes the admin Service with the admin token.
	sm := kinds["ServiceMonitor"][0]
	assert.Equal(t, "admin", dig(sm, "spec", "endpoints", 0, "port"))
	assert.Equal(t, "admin-token", dig(sm, "spec", "endpoints", 0, "authorization", "credentials", "key"))
	assert.Equal(t, find(t, ms, "Secret", "-auth").name(), dig(sm, "spec", "endpoints", 0, "authorization", "credentials", "name"))
	assert.Equal(t, "prometheus", dig(sm, "metadata", "labels", "release"))

	// The client sidecar: a native sidecar whose flags the client accepts, verifying
	// the server with the public certificate only.
	job := kinds["Job"][0]
	assert.Equal(t, "test", dig(job, "metadata", "annotations", "helm.sh/hook"), "the example runs with helm test")
	side := dig(job, "spec", "template", "spec", "initContainers", 0)
	assert.Equal(t, "Always", dig(side, "restartPolicy"))
	assert.Equal(t, "/readyz", dig(side, "startupProbe", "httpGet", "path"))
	assert.Nil(t, dig(side, "env"), "the client sidecar gets no Go runtime setting")
	var args []string
	for _, a := range dig(side, "args").([]any) {
		args = append(args, str(a))
	}
	assert.Contains(t, args, "--forward=tcp:127.0.0.1:6500="+echoToken, "the example leads with --forward")
	assert.Contains(t, args, "--server-endpoint=quictun-server-replicas.quictun.svc.cluster.local:7500", "every replica, by the headless Service")
	assert.Contains(t, args, "--server-mode=failover")
	out, err = checkConfig(t, "quictun-client", args...)
	require.NoError(t, err, "sidecar args %v: %s", args, out)
	for _, v := range dig(job, "spec", "template", "spec", "volumes").([]any) {
		if str(dig(v, "name")) == "server-ca" {
			assert.Equal(t, []any{map[string]any{"key": "cert.pem", "path": "cert.pem"}}, dig(v, "secret", "items"), "only the certificate, never the key")
		}
	}
	app := dig(job, "spec", "template", "spec", "containers", 0)
	assert.Equal(t, []any{"/usr/local/bin/latency-client"}, dig(app, "command"))
}

func TestHelmExistingSecrets(t *testing.T) {
	t.Parallel()
	helm := lookTool(t, "helm")
	ms := helmTemplate(t, helm, "-f", deployPath(t, "helm", "quictun", "ci", "existing-secrets-values.yaml"))
	kinds := byKind(ms)
	assert.Empty(t, kinds["Secret"], "existing Secrets are not rendered")
	assert.Empty(t, kinds["PodDisruptionBudget"])
	dep := find(t, ms, "Deployment", "-server")
	vols := map[string]string{}
	for _, v := range dig(dep, "spec", "template", "spec", "volumes").([]any) {
		if s := str(dig(v, "secret", "secretName")); s != "" {
			vols[str(dig(v, "name"))] = s
		}
	}
	assert.Equal(t, map[string]string{"auth": "quictun-auth", "state": "quictun-state"}, vols)
	svc := find(t, ms, "Service", "-server")
	assert.Equal(t, "ClusterIP", dig(svc, "spec", "type"))
	assert.Nil(t, dig(svc, "spec", "externalTrafficPolicy"), "externalTrafficPolicy is invalid on ClusterIP")
	side := dig(find(t, ms, "Job", "-client-example"), "spec", "template", "spec", "initContainers", 0)
	var args []string
	for _, a := range dig(side, "args").([]any) {
		args = append(args, str(a))
	}
	assert.Contains(t, args, "--server-fingerprint=sha256:680a65adfc1de69fc250f772ec7ced1db266e84482e689a1a784fd7e41131e7a")
	out, err := checkConfig(t, "quictun-client", args...)
	require.NoError(t, err, "sidecar args %v: %s", args, out)
}

func TestHelmRefusesInvalidValues(t *testing.T) {
	t.Parallel()
	helm := lookTool(t, "helm")
	for _, set := range [][]string{
		{"--set", "clientExample.enabled=true"}, // no token source, no demo echo
		{"--set", "server.service.type=Nodeport"},
		{"--set", "server.allowFor={tcp:10.0.0.5:5432}"}, // no identity
	} {
		args := append([]string{"template", "quictun", deployPath(t, "helm", "quictun")}, set...)
		out, err := exec.Command(helm, args...).CombinedOutput()
		assert.Error(t, err, "helm %v accepted: %s", set, out)
	}
}

// tlsHandshake runs a TLS 1.3 handshake with the generated certificate, the client
// verifying it as its own CA for the name quictun-server: what the sidecar's
// --ca-file cert.pem --server-name quictun-server does.
func tlsHandshake(t *testing.T, cert tls.Certificate, caPEM []byte) {
	t.Helper()
	pool := x509.NewCertPool()
	require.True(t, pool.AppendCertsFromPEM(caPEM))
	sc, cc := net.Pipe()
	defer func() { _ = sc.Close(); _ = cc.Close() }()
	require.NoError(t, sc.SetDeadline(time.Now().Add(10*time.Second)))
	require.NoError(t, cc.SetDeadline(time.Now().Add(10*time.Second)))
	srv := tls.Server(sc, &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS13})
	done := make(chan error, 1)
	go func() { done <- srv.Handshake() }()
	cli := tls.Client(cc, &tls.Config{RootCAs: pool, ServerName: transport.ServerName, MinVersion: tls.VersionTLS13})
	require.NoError(t, cli.Handshake(), "client handshake")
	require.NoError(t, <-done, "server handshake")
}
