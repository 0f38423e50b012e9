package deploy

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gopkg.in/yaml.v3"
)

// instruction is one Dockerfile instruction with continuation lines joined.
type instruction struct {
	cmd, args string
}

func parseDockerfile(t *testing.T, path string) []instruction {
	t.Helper()
	var out []instruction
	var cur strings.Builder
	for _, line := range strings.Split(string(readFile(t, path)), "\n") {
		trim := strings.TrimSpace(line)
		if cur.Len() == 0 && (trim == "" || strings.HasPrefix(trim, "#")) {
			continue
		}
		if strings.HasPrefix(trim, "#") {
			continue // a comment inside a continued instruction
		}
		if s, ok := strings.CutSuffix(trim, "\\"); ok {
			cur.WriteString(s + " ")
			continue
		}
		cur.WriteString(trim)
		cmd, args, _ := strings.Cut(cur.String(), " ")
		out = append(out, instruction{strings.ToUpper(cmd), strings.TrimSpace(args)})
		cur.Reset()
	}
	require.Zero(t, cur.Len(), "Dockerfile ends inside a continued line")
	return out
}

func TestDockerfile(t *testing.T) {
	t.Parallel()
	path := deployPath(t, "docker", "Dockerfile")
	ins := parseDockerfile(t, path)
	args := map[string]string{}
	var stages [][]instruction
	for _, in := range ins {
		switch in.cmd {
		case "ARG":
			k, v, _ := strings.Cut(in.args, "=")
			if _, seen := args[k]; !seen || v != "" {
				args[k] = v
			}
		case "FROM":
			stages = append(stages, nil)
		}
		if len(stages) > 0 {
			stages[len(stages)-1] = append(stages[len(stages)-1], in)
		}
		assert.Contains(t, []string{"ARG", "FROM", "WORKDIR", "COPY", "RUN", "LABEL", "USER", "EXPOSE", "ENTRYPOINT", "CMD", "ENV"}, in.cmd, "unexpected instruction %s", in.cmd)
	}
	require.Len(t, stages, 2, "a builder stage and a runtime stage")

	// Builder: the Go version of go.mod, static and reproducible binaries.
	gomod := string(readFile(t, filepath.Join(repoRoot(t), "go.mod")))
	goVersion := regexp.MustCompile(`(?m)^go (\d+\.\d+)`).FindStringSubmatch(gomod)
	require.NotNil(t, goVersion)
	assert.Equal(t, goVersion[1], args["GO_VERSION"], "ARG GO_VERSION must follow go.mod")
	assert.Contains(t, stages[0][0].args, "golang:${GO_VERSION}")
	assert.Contains(t, stages[0][0].args, " AS build")
	var build string
	for _, in := range stages[0] {
		if in.cmd == "RUN" && strings.Contains(in.args, "go build") {
			build = in.args
		}
	}
	require.NotEmpty(t, build, "no go build in the builder stage")
	assert.Contains(t, build, "CGO_ENABLED=0")
	assert.Contains(t, build, "-trimpath")
	for _, pkg := range regexp.MustCompile(`\./(?:cmd|tools)/[a-z-]+`).FindAllString(build, -1) {
		assert.DirExists(t, filepath.Join(repoRoot(t), pkg), "go build package %s", pkg)
	}
	for _, bin := range []string{"quictun-server", "quictun-client", "latency-client"} {
		assert.Contains(t, build, "/"+bin, "image must contain %s", bin)
	}
	// Version stamping uses the package the Makefile stamps.
	assert.Contains(t, build, "github.com/quictun/quictun/pkg/version.Version=")

	// Runtime: small base, non-root, exec-form entrypoint, the QUIC port.
	assert.Equal(t, "${BASE_IMAGE}", stages[1][0].args)
	assert.Regexp(t, `distroless/static.*:nonroot|^scratch$`, args["BASE_IMAGE"])
	var user, entrypoint string
	exposed := map[string]bool{}
	for _, in := range stages[1] {
		switch in.cmd {
		case "USER":
			user = in.args
		case "ENTRYPOINT":
			entrypoint = in.args
		case "EXPOSE":
			for _, p := range strings.Fields(in.args) {
				exposed[p] = true
			}
		case "RUN":
			t.Errorf("the distroless runtime stage has no shell: RUN %s", in.args)
		}
	}
	require.NotEmpty(t, user, "runtime stage has no USER")
	uid, _, _ := strings.Cut(user, ":")
	assert.NotContains(t, []string{"0", "root"}, uid, "must not run as root")
	var ep []string
	require.NoError(t, json.Unmarshal([]byte(entrypoint), &ep), "ENTRYPOINT must be exec form")
	assert.Equal(t, []string{"/usr/local/bin/quictun-server"}, ep)
	assert.True(t, exposed["7500/udp"], "EXPOSE 7500/udp")
	assert.True(t, exposed["7500/tcp"], "EXPOSE 7500/tcp (the TCP fallback listens on the QUIC port)")

	// CMD names a configuration the image holds: the build stage copies
	// deploy/docker/server.yaml to /etc/quictun/server.yaml, which is valid.
	text := string(readFile(t, path))
	assert.Contains(t, text, `CMD ["--config", "/etc/quictun/server.yaml"]`)
	assert.Contains(t, text, "cp deploy/docker/server.yaml /out/etc/server.yaml")
	assert.Contains(t, text, "COPY --from=build /out/etc /etc/quictun")
	assert.Contains(t, string(readFile(t, deployPath(t, "docker", "Dockerfile.dockerignore"))), "\n!deploy/docker/server.yaml\n",
		"the build context keeps the image's configuration")
	out, err := checkConfig(t, "quictun-server", "--config", deployPath(t, "docker", "server.yaml"), "--check-config=flags")
	require.NoError(t, err, out)

	ignore := string(readFile(t, deployPath(t, "docker", "Dockerfile.dockerignore")))
	for _, p := range []string{".git", "bin"} {
		assert.Regexp(t, `(?m)^`+regexp.QuoteMeta(p)+`$`, ignore)
	}
}

func TestHadolint(t *testing.T) {
	t.Parallel()
	hl := lookTool(t, "hadolint")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, hl, deployPath(t, "docker", "Dockerfile")).CombinedOutput()
	require.NoError(t, err, "%s", out)
}

type composeService struct {
	Image           string   `yaml:"image"`
	Entrypoint      []string `yaml:"entrypoint"`
	Command         []string `yaml:"command"`
	ReadOnly        bool     `yaml:"read_only"`
	CapDrop         []string `yaml:"cap_drop"`
	SecurityOpt     []string `yaml:"security_opt"`
	Ports           []string `yaml:"ports"`
	Secrets         []string `yaml:"secrets"`
	StopGracePeriod string   `yaml:"stop_grace_period"`
	Environment     map[string]string
	Configs         []struct {
		Source string `yaml:"source"`
		Target string `yaml:"target"`
	} `yaml:"configs"`
	Networks []string `yaml:"networks"`
}

type composeFile struct {
	Services map[string]composeService `yaml:"services"`
	Configs  map[string]struct {
		File string `yaml:"file"`
	} `yaml:"configs"`
	Secrets map[string]struct {
		File string `yaml:"file"`
	} `yaml:"secrets"`
	Volumes  map[string]any `yaml:"volumes"`
	Networks map[string]any `yaml:"networks"`
}

func TestDockerCompose(t *testing.T) {
	t.Parallel()
	dir := deployPath(t, "docker")
	var cf composeFile
	require.NoError(t, yaml.Unmarshal(readFile(t, filepath.Join(dir, "docker-compose.yml")), &cf)) // resolves the << merge
	require.Len(t, cf.Services, 3)
	for _, name := range []string{"echo", "server", "client"} {
		require.Contains(t, cf.Services, name)
	}
	initScript := string(readFile(t, filepath.Join(dir, "init.sh")))
	configText := map[string][]byte{}
	for name, s := range cf.Services {
		assert.True(t, s.ReadOnly, "%s: read_only", name)
		assert.Equal(t, []string{"ALL"}, s.CapDrop, "%s: cap_drop", name)
		assert.Contains(t, s.SecurityOpt, "no-new-privileges:true", "%s", name)
		assert.Equal(t, "quictun:dev", s.Image, "%s: one image for every service", name)
		if len(s.Entrypoint) > 0 {
			assert.Regexp(t, `^/usr/local/bin/(quictun-client|latency-client)$`, s.Entrypoint[0], "%s: a binary the image has", name)
		}
		for _, n := range s.Networks {
			assert.Contains(t, cf.Networks, n, "%s: network %s", name, n)
		}
		for _, sec := range s.Secrets {
			def, ok := cf.Secrets[sec]
			if assert.True(t, ok, "%s: secret %s not defined", name, sec) {
				// Generated by init.sh into the git-ignored secrets/ directory.
				assert.True(t, strings.HasPrefix(def.File, "./secrets/"), "secret %s: %s", sec, def.File)
				assert.Contains(t, initScript, strings.TrimPrefix(def.File, "./secrets/"), "init.sh must create %s", def.File)
			}
		}
		for _, c := range s.Configs {
			def, ok := cf.Configs[c.Source]
			if assert.True(t, ok, "%s: config %s not defined", name, c.Source) {
				configText[name] = readFile(t, filepath.Join(dir, def.File))
			}
		}
	}

	// The configs pass --check-config with the command line compose gives them.
	server, client := cf.Services["server"], cf.Services["client"]
	require.Len(t, server.Configs, 1)
	require.Len(t, client.Configs, 1)
	srvCfg := filepath.Join(dir, cf.Configs[server.Configs[0].Source].File)
	cliCfg := filepath.Join(dir, cf.Configs[client.Configs[0].Source].File)
	assert.Equal(t, []string{"--config", server.Configs[0].Target}, server.Command)
	assert.Equal(t, []string{"--config", client.Configs[0].Target}, client.Command)
	out, err := checkConfig(t, "quictun-server", "--config", srvCfg)
	require.NoError(t, err, out)
	assert.Contains(t, client.Environment, "QUICTUN_SERVER_FINGERPRINT", "the client gets the fingerprint from .env")
	out, err = checkConfig(t, "quictun-client", "--config", cliCfg,
		"--server-fingerprint", "sha256:680a65adfc1de69fc250f772ec7ced1db266e84482e689a1a784fd7e41131e7a")
	require.NoError(t, err, out)

	// Files the configs name are the secrets mounted into that service.
	for name, text := range configText {
		for _, key := range []string{"secret-file", "httpd-token-file"} {
			p := yamlScalar(t, text, key)
			sec, ok := strings.CutPrefix(p, "/run/secrets/")
			if assert.True(t, ok, "%s: %s %s is not a compose secret", name, key, p) {
				assert.Contains(t, cf.Services[name].Secrets, sec, "%s: %s", name, key)
			}
		}
	}

	// The wiring: client -> server:7500/udp -> echo:15676.
	srvText, cliText := configText["server"], configText["client"]
	_, port, _ := strings.Cut(yamlScalar(t, srvText, "listen-on"), ":")
	assert.Equal(t, "server:"+port, yamlScalar(t, cliText, "server-endpoint"))
	assert.Contains(t, server.Ports, port+":"+port+"/udp")
	echo := cf.Services["echo"]
	require.GreaterOrEqual(t, len(echo.Command), 3)
	_, echoPort, _ := strings.Cut(echo.Command[2], ":")
	fwd := regexp.MustCompile(`(?m)^forward:\n  - (\S+)=(\S+)$`).FindSubmatch(cliText)
	require.NotNil(t, fwd, "the client's config forwards with forward: [LISTEN=DESTINATION]")
	dest := string(fwd[2])
	assert.Equal(t, "tcp:echo:"+echoPort, dest)
	assert.Contains(t, string(srvText), "="+dest, "the server's allow list must permit the client's destination")

	// Docker's stop timeout covers the drain.
	for _, name := range []string{"server", "client"} {
		grace, err := time.ParseDuration(cf.Services[name].StopGracePeriod)
		require.NoError(t, err, name)
		drain, err := time.ParseDuration(yamlScalar(t, configText[name], "drain-timeout"))
		require.NoError(t, err, name)
		assert.Greater(t, grace, drain, "%s: stop_grace_period must exceed drain-timeout", name)
	}
}

func TestDockerComposeConfig(t *testing.T) {
	t.Parallel()
	docker := lookTool(t, "docker")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := exec.CommandContext(ctx, docker, "compose", "version").Run(); err != nil {
		t.Skipf("docker compose plugin not available: %v", err)
	}
	dir := t.TempDir() // compose needs the secret files to exist
	src := deployPath(t, "docker")
	require.NoError(t, os.CopyFS(dir, os.DirFS(src)))
	require.NoError(t, os.MkdirAll(filepath.Join(dir, "secrets"), 0o700))
	for _, f := range []string{"secret", "admin-token"} {
		require.NoError(t, os.WriteFile(filepath.Join(dir, "secrets", f), []byte("0123456789abcdef0123\n"), 0o600))
	}
	cmd := exec.CommandContext(ctx, docker, "compose", "-f", filepath.Join(dir, "docker-compose.yml"), "config", "--quiet")
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s", out)
}

func TestInitScriptSyntax(t *testing.T) {
	t.Parallel()
	bash := lookTool(t, "bash")
	for _, script := range []string{deployPath(t, "docker", "init.sh"), deployPath(t, "helm", "check.sh")} {
		if _, err := os.Stat(script); err != nil {
			t.Errorf("%s: %v", script, err)
			continue
		}
		out, err := exec.Command(bash, "-n", script).CombinedOutput()
		assert.NoError(t, err, "%s: %s", script, out)
	}
}
