package reference

import (
	"bytes"
	"image"
	"image/color"
	"image/png"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// chart writes a PNG with more than 256 colours (a gradient band, as
// anti-aliased edges give) over a flat background.
func chart(t *testing.T, path string) {
	t.Helper()
	img := image.NewRGBA(image.Rect(0, 0, 400, 200))
	for y := 0; y < 200; y++ {
		for x := 0; x < 400; x++ {
			c := color.RGBA{255, 255, 255, 255}
			if y < 20 {
				c = color.RGBA{uint8(x), uint8(x / 2), uint8(y * 10), 255}
			}
			img.Set(x, y, c)
		}
	}
	var buf bytes.Buffer
	require.NoError(t, png.Encode(&buf, img))
	require.NoError(t, os.WriteFile(path, buf.Bytes(), 0o644))
}

func TestCopy(t *testing.T) {
	run, dir := t.TempDir(), t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(run, "report.md"), []byte("# report\n"), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(run, "results.json"), []byte("{}"), 0o644))
	require.NoError(t, os.MkdirAll(filepath.Join(run, "raw"), 0o755))
	chart(t, filepath.Join(run, "latency.png"))
	// An earlier reference of the profile is replaced as a whole.
	require.NoError(t, os.MkdirAll(filepath.Join(dir, "quick"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "quick", "old.png"), []byte("x"), 0o644))

	require.NoError(t, Copy(run, dir, "quick"))

	entries, err := os.ReadDir(filepath.Join(dir, "quick"))
	require.NoError(t, err)
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	require.Equal(t, []string{"latency.png", "report.md"}, names)
	f, err := os.Open(filepath.Join(dir, "quick", "latency.png"))
	require.NoError(t, err)
	defer f.Close()
	img, err := png.Decode(f)
	require.NoError(t, err)
	require.Equal(t, image.Rect(0, 0, 400, 200), img.Bounds())
}

// TestPaletted: a chart of more colours than paletteSize comes back as a paletted
// PNG whose flat colours are exact.
func TestPaletted(t *testing.T) {
	path := filepath.Join(t.TempDir(), "c.png")
	chart(t, path)
	data, err := os.ReadFile(path)
	require.NoError(t, err)
	out, err := paletted(data)
	require.NoError(t, err)
	img, err := png.Decode(bytes.NewReader(out))
	require.NoError(t, err)
	p, ok := img.(*image.Paletted)
	require.True(t, ok, "re-encoded with a palette")
	require.LessOrEqual(t, len(p.Palette), paletteSize)
	require.Equal(t, color.RGBA{255, 255, 255, 255}, color.RGBAModel.Convert(p.At(10, 100)))
}

func TestCopyRefuses(t *testing.T) {
	dir := t.TempDir()
	require.ErrorContains(t, Copy(t.TempDir(), dir, "quick"), "no report.md")
	require.ErrorContains(t, Copy(t.TempDir(), dir, "../etc"), "lower-case word")
}
