package netns

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestValidatePrefix(t *testing.T) {
	t.Parallel()
	for _, ok := range []string{"qt", "a", "bench1", "abcdefghij"} {
		assert.NoError(t, ValidatePrefix(ok), ok)
	}
	for _, bad := range []string{"", "1qt", "Qt", "q-t", "q/t", "abcdefghijk", "../x"} {
		assert.Error(t, ValidatePrefix(bad), bad)
	}
	c, s := Names("qt")
	assert.Equal(t, "qt-c", c)
	assert.Equal(t, "qt-s", s)
}
