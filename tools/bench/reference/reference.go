// Package reference keeps one benchmark run per profile in the repository
// (bench/reference/PROFILE): the run's report, notes and charts, with the
// charts re-encoded to a 16-colour palette so that the reference runs stay
// a few hundred KB. Every other run stays out of git (bench/runs/).
package reference

import (
	"errors"
	"fmt"
	"image"
	"image/color"
	"image/draw"
	"image/png"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
)

// paletteSize is the colours a reference chart keeps: a chart's series (six in
// the cc profile's), background, grid and text, and a few shades of their
// anti-aliased edges; it makes a chart about a fifth of its size.
const paletteSize = 16

// profileName is what may name a reference: a word, so that PROFILE cannot
// point outside bench/reference.
var profileName = regexp.MustCompile(`^[a-z][a-z0-9-]*$`)

// Copy replaces dir/profile with run's report.md, NOTE.md (if any) and *.png
// charts. run must hold a report.md.
func Copy(run, dir, profile string) error {
	if !profileName.MatchString(profile) {
		return fmt.Errorf("profile %q: want a lower-case word such as quick, full, cc, stn, loopback, scale", profile)
	}
	if _, err := os.Stat(filepath.Join(run, "report.md")); err != nil {
		return fmt.Errorf("%s is not a bench run (no report.md): %w", run, err)
	}
	entries, err := os.ReadDir(run)
	if err != nil {
		return err
	}
	dst := filepath.Join(dir, profile)
	tmp := dst + ".tmp"
	if err := os.RemoveAll(tmp); err != nil {
		return err
	}
	if err := os.MkdirAll(tmp, 0o755); err != nil {
		return err
	}
	for _, e := range entries {
		name := e.Name()
		if e.IsDir() || !(name == "report.md" || name == "NOTE.md" || strings.HasSuffix(name, ".png")) {
			continue
		}
		if err := copyFile(filepath.Join(run, name), filepath.Join(tmp, name)); err != nil {
			return errors.Join(err, os.RemoveAll(tmp))
		}
	}
	if err := os.RemoveAll(dst); err != nil {
		return err
	}
	return os.Rename(tmp, dst)
}

func copyFile(src, dst string) error {
	data, err := os.ReadFile(src)
	if err != nil {
		return err
	}
	if strings.HasSuffix(src, ".png") {
		if small, err := paletted(data); err == nil && len(small) < len(data) {
			data = small
		}
	}
	return os.WriteFile(dst, data, 0o644)
}

// paletted re-encodes a PNG with the paletteSize most frequent colours of
// the image (a chart's flat colours; anti-aliased edges take the nearest).
func paletted(data []byte) ([]byte, error) {
	img, err := png.Decode(strings.NewReader(string(data)))
	if err != nil {
		return nil, err
	}
	b := img.Bounds()
	count := map[color.RGBA]int{}
	for y := b.Min.Y; y < b.Max.Y; y++ {
		for x := b.Min.X; x < b.Max.X; x++ {
			count[color.RGBAModel.Convert(img.At(x, y)).(color.RGBA)]++
		}
	}
	colours := make([]color.RGBA, 0, len(count))
	for c := range count {
		colours = append(colours, c)
	}
	sort.Slice(colours, func(i, j int) bool {
		if count[colours[i]] != count[colours[j]] {
			return count[colours[i]] > count[colours[j]]
		}
		return rgbaKey(colours[i]) < rgbaKey(colours[j])
	})
	pal := make(color.Palette, 0, paletteSize)
	for _, c := range colours[:min(paletteSize, len(colours))] {
		pal = append(pal, c)
	}
	p := image.NewPaletted(b, pal)
	draw.Draw(p, b, img, b.Min, draw.Src)
	var out strings.Builder
	enc := png.Encoder{CompressionLevel: png.BestCompression}
	if err := enc.Encode(&out, p); err != nil {
		return nil, err
	}
	return []byte(out.String()), nil
}

func rgbaKey(c color.RGBA) uint32 {
	return uint32(c.R)<<24 | uint32(c.G)<<16 | uint32(c.B)<<8 | uint32(c.A)
}
