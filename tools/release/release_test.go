package main

import (
	"archive/tar"
	"archive/zip"
	"bytes"
	"compress/gzip"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/validate"
)

var testTime = time.Unix(1764100000, 0).UTC()

func testFiles() []file {
	return []file{
		{name: "quictun-server", mode: 0o755, data: []byte("server binary")},
		{name: "README.md", mode: 0o644, data: []byte("# quictun\n")},
	}
}

// TestArchivesAreReproducibleAndComplete: the same files give the same
// bytes, whatever their order and the clock; each entry is under the
// top directory with its mode and the fixed time.
func TestArchivesAreReproducibleAndComplete(t *testing.T) {
	files := testFiles()
	reversed := slices.Clone(files)
	slices.Reverse(reversed)
	for _, tc := range []struct {
		name string
		make func(string, []file, time.Time) ([]byte, error)
		list func(*testing.T, []byte) map[string]string
	}{
		{"tar.gz", tarGz, listTarGz},
		{"zip", zipArchive, listZip},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, err := tc.make("quictun_v1_os_arch", files, testTime)
			if err != nil {
				t.Fatal(err)
			}
			b, err := tc.make("quictun_v1_os_arch", reversed, testTime)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(a, b) {
				t.Fatal("the same files gave different archives")
			}
			got := tc.list(t, a)
			want := map[string]string{
				"quictun_v1_os_arch/":               "dir",
				"quictun_v1_os_arch/README.md":      "-rw-r--r-- # quictun\n",
				"quictun_v1_os_arch/quictun-server": "-rwxr-xr-x server binary",
			}
			if len(got) != len(want) {
				t.Fatalf("entries %v, want %v", got, want)
			}
			for k, v := range want {
				if got[k] != v {
					t.Errorf("%s: %q, want %q", k, got[k], v)
				}
			}
		})
	}
}

func listTarGz(t *testing.T, b []byte) map[string]string {
	t.Helper()
	gz, err := gzip.NewReader(bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	if !gz.ModTime.IsZero() || gz.Name != "" {
		t.Errorf("gzip header has a time %v or name %q", gz.ModTime, gz.Name)
	}
	tr := tar.NewReader(gz)
	out := map[string]string{}
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		if !h.ModTime.Equal(testTime) || h.Uid != 0 || h.Gid != 0 {
			t.Errorf("%s: time %v uid %d gid %d", h.Name, h.ModTime, h.Uid, h.Gid)
		}
		if h.Typeflag == tar.TypeDir {
			out[h.Name] = "dir"
			continue
		}
		data, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		out[h.Name] = h.FileInfo().Mode().String() + " " + string(data)
	}
}

func listZip(t *testing.T, b []byte) map[string]string {
	t.Helper()
	zr, err := zip.NewReader(bytes.NewReader(b), int64(len(b)))
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, f := range zr.File {
		if !f.Modified.Equal(testTime) {
			t.Errorf("%s: time %v", f.Name, f.Modified)
		}
		if f.FileInfo().IsDir() {
			out[f.Name] = "dir"
			continue
		}
		rc, err := f.Open()
		if err != nil {
			t.Fatal(err)
		}
		data, err := io.ReadAll(rc)
		_ = rc.Close()
		if err != nil {
			t.Fatal(err)
		}
		out[f.Name] = f.Mode().String() + " " + string(data)
	}
	return out
}

func TestWriteSums(t *testing.T) {
	dir := t.TempDir()
	for _, n := range []string{"b.zip", "a.tar.gz"} {
		if err := os.WriteFile(filepath.Join(dir, n), []byte("abc"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := writeSums(dir, []string{"b.zip", "a.tar.gz"}); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(dir, "SHA256SUMS"))
	if err != nil {
		t.Fatal(err)
	}
	// sha256("abc"), in sha256sum's format, sorted by name.
	const h = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
	if want := h + "  a.tar.gz\n" + h + "  b.zip\n"; string(b) != want {
		t.Fatalf("SHA256SUMS:\n%s\nwant:\n%s", b, want)
	}
}

// TestImage writes the image as make image does, reads the tarball back as
// docker load and crane push would, validates it (crane validate's check:
// every digest and size matches), and checks its config and files.
func TestImage(t *testing.T) {
	dir := t.TempDir()
	var bins []string
	for _, n := range []string{"quictun-server", "quictun-client", "latency-client"} {
		p := filepath.Join(dir, n)
		if err := os.WriteFile(p, []byte("#!binary "+n), 0o755); err != nil {
			t.Fatal(err)
		}
		bins = append(bins, p)
	}
	img, err := Image("arm64", "1.2.3", bins, []byte("listen-on: 0.0.0.0:7500\n"), testTime)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "image.tar")
	ref := name.MustParseReference("quictun:1.2.3")
	if err := tarball.WriteToFile(path, ref, img); err != nil {
		t.Fatal(err)
	}
	back, err := tarball.ImageFromPath(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := validate.Image(back); err != nil {
		t.Fatalf("invalid image tarball: %v", err)
	}
	// docker load reads manifest.json's RepoTags.
	manifest := readTarEntry(t, path, "manifest.json")
	var m []struct{ RepoTags []string }
	if err := json.Unmarshal(manifest, &m); err != nil || len(m) != 1 || !slices.Equal(m[0].RepoTags, []string{"quictun:1.2.3"}) {
		t.Fatalf("manifest.json %s: %v", manifest, err)
	}
	cf, err := back.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if cf.OS != "linux" || cf.Architecture != "arm64" || !cf.Created.Equal(testTime) {
		t.Errorf("platform %s/%s created %v", cf.OS, cf.Architecture, cf.Created)
	}
	if !slices.Equal(cf.Config.Entrypoint, []string{"/usr/local/bin/quictun-server"}) {
		t.Errorf("entrypoint %v", cf.Config.Entrypoint)
	}
	if cf.Config.User != "65532:65532" {
		t.Errorf("user %q, want the non-root 65532:65532", cf.Config.User)
	}
	layers, err := back.Layers()
	if err != nil || len(layers) != 1 {
		t.Fatalf("layers %d: %v", len(layers), err)
	}
	rc, err := layers[0].Uncompressed()
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = rc.Close() }()
	tr := tar.NewReader(rc)
	seen := map[string]*tar.Header{}
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		seen[strings.TrimSuffix(h.Name, "/")] = h
	}
	if cf.Config.Cmd[len(cf.Config.Cmd)-1] != "/"+ServerConfig || seen[ServerConfig] == nil {
		t.Errorf("CMD %v names a configuration the image lacks (%v)", cf.Config.Cmd, seen[ServerConfig] != nil)
	}
	for _, p := range []string{"7500/udp", "7500/tcp"} {
		if _, ok := cf.Config.ExposedPorts[p]; !ok {
			t.Errorf("%s not exposed (the TCP fallback listens on the QUIC port): %v", p, cf.Config.ExposedPorts)
		}
	}
	for _, p := range []string{"usr/local/bin/quictun-server", "usr/local/bin/quictun-client", "usr/local/bin/latency-client", "etc/passwd"} {
		if seen[p] == nil {
			t.Errorf("no %s in the image", p)
		}
	}
	if h := seen[StateDir]; h == nil || h.Uid != NonRoot || h.Mode&0o777 != 0o700 {
		t.Errorf("state dir %+v, want owned by %d, mode 0700", h, NonRoot)
	}
	// Reproducible: the same inputs give the same image.
	again, err := Image("arm64", "1.2.3", bins, []byte("listen-on: 0.0.0.0:7500\n"), testTime)
	if err != nil {
		t.Fatal(err)
	}
	d1, _ := img.Digest()
	d2, _ := again.Digest()
	if d1 != d2 {
		t.Errorf("digests %s and %s of the same inputs", d1, d2)
	}
}

func readTarEntry(t *testing.T, path, entry string) []byte {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = f.Close() }()
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if err != nil {
			t.Fatalf("no %s in %s: %v", entry, path, err)
		}
		if h.Name == entry {
			b, err := io.ReadAll(tr)
			if err != nil {
				t.Fatal(err)
			}
			return b
		}
	}
}

// TestChartNamesTheImage: the Helm chart's default image.repository is the
// repository make image tags (the Makefile's IMAGE_REPO), so a loaded or
// pushed image is the one the chart runs.
func TestChartNamesTheImage(t *testing.T) {
	values, err := os.ReadFile("../../deploy/helm/quictun/values.yaml")
	if err != nil {
		t.Fatal(err)
	}
	_, image, ok := strings.Cut(string(values), "\nimage:\n")
	if !ok {
		t.Fatal("no image: in values.yaml")
	}
	var repo string
	for _, line := range strings.Split(image, "\n") {
		if r, ok := strings.CutPrefix(line, "  repository: "); ok {
			repo = strings.TrimSpace(r)
			break
		}
	}
	makefile, err := os.ReadFile("../../Makefile")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(makefile), "\nIMAGE_REPO ?= "+repo+"\n") {
		t.Errorf("values.yaml image.repository is %q; the Makefile's IMAGE_REPO is not", repo)
	}
}
