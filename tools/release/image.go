package main

import (
	"archive/tar"
	"bytes"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// NonRoot is the image's user and group, distroless's "nonroot" (65532),
// so the Helm chart's runAsNonRoot holds without a runAsUser.
const NonRoot = 65532

// StateDir is the server's state directory in the image, owned by NonRoot
// (deploy/docker/Dockerfile has the same layout).
const StateDir = "var/lib/quictun-server"

// ServerConfig is the configuration the image's CMD names, and
// ServerConfigSource the repository's file it is (deploy/docker/Dockerfile
// copies the same).
const (
	ServerConfig       = "etc/quictun/server.yaml"
	ServerConfigSource = "deploy/docker/server.yaml"
)

func images(o options) error {
	tmp, err := os.MkdirTemp("", "quictun-image-")
	if err != nil {
		return err
	}
	defer func() { _ = os.RemoveAll(tmp) }()
	tag := strings.TrimPrefix(o.version, "v") // the chart's appVersion has no "v"
	ref, err := name.NewTag(o.repo + ":" + tag)
	if err != nil {
		return fmt.Errorf("image tag: %w", err)
	}
	mtime := time.Unix(o.mtime, 0).UTC()
	serverConfig, err := os.ReadFile(filepath.Join(o.root, ServerConfigSource))
	if err != nil {
		return err
	}
	idx := mutate.IndexMediaType(empty.Index, types.OCIImageIndex)
	for _, arch := range strings.Fields(o.arches) {
		bins, err := build(o, "linux", arch, filepath.Join(tmp, arch))
		if err != nil {
			return err
		}
		img, err := Image(arch, tag, bins, serverConfig, mtime)
		if err != nil {
			return err
		}
		path := filepath.Join(o.out, fmt.Sprintf("quictun_%s_linux_%s.image.tar", o.version, arch))
		if err := tarball.WriteToFile(path, ref, img); err != nil {
			return fmt.Errorf("write %s: %w", path, err)
		}
		fmt.Fprintf(os.Stderr, "wrote %s (%s, linux/%s)\n", path, ref, arch)
		idx = mutate.AppendManifests(idx, mutate.IndexAddendum{Add: img, Descriptor: v1.Descriptor{
			Platform: &v1.Platform{OS: "linux", Architecture: arch},
		}})
	}
	dir := filepath.Join(o.out, "oci")
	if err := os.RemoveAll(dir); err != nil {
		return err
	}
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		return err
	}
	if err := p.AppendIndex(idx, layout.WithAnnotations(map[string]string{"org.opencontainers.image.ref.name": ref.String()})); err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "wrote %s (OCI layout, %s for %s)\n", dir, ref, o.arches)
	return nil
}

// Image is the image of one architecture: bins in /usr/local/bin on an
// empty base (static binaries need no libc; the client verifies the server
// by fingerprint or --ca-file, so no CA bundle), the quictun-server
// entrypoint and the non-root user, as deploy/docker/Dockerfile builds it.
func Image(arch, version string, bins []string, serverConfig []byte, mtime time.Time) (v1.Image, error) {
	layerTar, err := rootfs(bins, serverConfig, mtime)
	if err != nil {
		return nil, err
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(layerTar)), nil
	}, tarball.WithMediaType(types.OCILayer))
	if err != nil {
		return nil, err
	}
	img := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	img, err = mutate.Append(img, mutate.Addendum{Layer: layer, History: v1.History{
		Created: v1.Time{Time: mtime}, CreatedBy: "tools/release image", Comment: "quictun " + version,
	}})
	if err != nil {
		return nil, err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture, cf.Created = "linux", arch, v1.Time{Time: mtime}
	cf.Config = v1.Config{
		Entrypoint:   []string{"/usr/local/bin/quictun-server"},
		Cmd:          []string{"--config", "/" + ServerConfig},
		User:         fmt.Sprintf("%d:%d", NonRoot, NonRoot),
		WorkingDir:   "/",
		Env:          []string{"PATH=/usr/local/bin"},
		ExposedPorts: map[string]struct{}{"7500/udp": {}, "7500/tcp": {}, "8086/tcp": {}},
		Labels: map[string]string{
			"org.opencontainers.image.title":       "quictun",
			"org.opencontainers.image.description": "TCP and UNIX-socket tunnels over QUIC",
			"org.opencontainers.image.source":      "https://github.com/quictun/quictun",
			"org.opencontainers.image.version":     version,
		},
	}
	return mutate.ConfigFile(img, cf)
}

// rootfs is the image's one layer: the directories the daemons use, an
// /etc/passwd naming the non-root user, and bins in /usr/local/bin.
func rootfs(bins []string, serverConfig []byte, mtime time.Time) ([]byte, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	dir := func(name string, mode int64, owner int) error {
		return tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: name + "/", Mode: mode, Uid: owner, Gid: owner, ModTime: mtime, Format: tar.FormatPAX})
	}
	reg := func(name string, mode int64, data []byte) error {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: mode, Size: int64(len(data)), ModTime: mtime, Format: tar.FormatPAX}); err != nil {
			return err
		}
		_, err := tw.Write(data)
		return err
	}
	for _, d := range []struct {
		name  string
		mode  int64
		owner int
	}{
		{"etc", 0o755, 0}, {"etc/quictun", 0o755, 0}, {"tmp", 0o1777, 0},
		{"usr", 0o755, 0}, {"usr/local", 0o755, 0}, {"usr/local/bin", 0o755, 0},
		{"var", 0o755, 0}, {"var/lib", 0o755, 0}, {StateDir, 0o700, NonRoot},
	} {
		if err := dir(d.name, d.mode, d.owner); err != nil {
			return nil, err
		}
	}
	if err := reg("etc/passwd", 0o644, fmt.Appendf(nil, "root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:%d:%d:nonroot:/home/nonroot:/sbin/nologin\n", NonRoot, NonRoot)); err != nil {
		return nil, err
	}
	if err := reg("etc/group", 0o644, fmt.Appendf(nil, "root:x:0:\nnonroot:x:%d:\n", NonRoot)); err != nil {
		return nil, err
	}
	if err := reg(ServerConfig, 0o644, serverConfig); err != nil {
		return nil, err
	}
	for _, p := range bins {
		b, err := os.ReadFile(p)
		if err != nil {
			return nil, err
		}
		if err := reg("usr/local/bin/"+filepath.Base(p), 0o755, b); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}
