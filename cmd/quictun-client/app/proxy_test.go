package app

import (
	"bytes"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/klog/v2/textlogger"

	"github.com/quictun/quictun/pkg/socks5"
)

// TestLogProxies: the start log says at -v 0 which proxy entry points
// require credentials, and warns for each one that does not.
func TestLogProxies(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		users socks5.Users
		want  []string
	}{
		{"no credentials file", nil, []string{
			`"Proxy entry point requires no credentials: whoever can connect to it uses this client's credentials and picks the destinations; set --proxy-credentials-file to require a username and password" address="127.0.0.1:1080" kind="socks5"`,
			`"Proxy entry point requires no credentials: whoever can connect to it uses this client's credentials and picks the destinations; set --proxy-credentials-file to require a username and password" address="127.0.0.1:8080" kind="http-connect"`,
		}},
		{"two users", socks5.Users{{User: "a", Password: "b"}, {User: "c", Password: "d"}}, []string{
			`"Proxy entry point requires credentials" address="127.0.0.1:1080" kind="socks5" users=2`,
			`"Proxy entry point requires credentials" address="127.0.0.1:8080" kind="http-connect" users=2`,
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var buf bytes.Buffer
			o := validOptions()
			o.Proxy = []string{"socks5:127.0.0.1:1080", "http-connect:127.0.0.1:8080"}
			o.logProxies(textlogger.NewLogger(textlogger.NewConfig(textlogger.Output(&buf))), tc.users)
			lines := bytes.Split(bytes.TrimSpace(buf.Bytes()), []byte("\n"))
			require.Len(t, lines, len(tc.want))
			for i, want := range tc.want {
				assert.Contains(t, string(lines[i]), want)
			}
		})
	}
}

func TestProxyCredentialsFile(t *testing.T) {
	t.Parallel()
	users, err := proxyCredentials("")
	require.NoError(t, err)
	assert.Nil(t, users, "no file: no credentials")
	assert.Nil(t, credentialsOf(users), "and none required (a nil interface, not an empty Users)")

	file := writeFile(t, "creds", "# users\napp:s3cret\nops:other\n")
	users, err = proxyCredentials(file)
	require.NoError(t, err)
	assert.Len(t, users, 2)
	assert.True(t, credentialsOf(users).Valid("ops", "other"))

	_, err = proxyCredentials(writeFile(t, "bad", "app:s3cret\nnocolon\n"))
	require.ErrorContains(t, err, "--proxy-credentials-file")
	require.ErrorContains(t, err, "line 2: want USER:PASSWORD")
}
