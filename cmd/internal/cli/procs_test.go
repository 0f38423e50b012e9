package cli

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestDefaultProcs(t *testing.T) {
	for cpus, want := range map[int]int{1: 1, 2: 1, 3: 1, 4: 2, 16: 8, 64: 32} {
		assert.Equal(t, want, DefaultProcs(cpus), "%d CPUs", cpus)
	}
}
