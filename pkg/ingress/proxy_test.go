package ingress

import (
	"net/netip"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/quictun/quictun/pkg/socks5"
)

func TestAssociateSource(t *testing.T) {
	t.Parallel()
	control := netip.MustParseAddr("127.0.0.1")
	ap := netip.MustParseAddrPort
	for _, tc := range []struct {
		name     string
		declared socks5.Addr
		packets  []string // sources, in order
		want     []bool
	}{
		{"zeros: first sender", socks5.Addr{IP: netip.IPv4Unspecified()},
			[]string{"127.0.0.2:5000", "127.0.0.1:5000", "127.0.0.1:5001", "127.0.0.1:5000"}, []bool{false, true, false, true}},
		{"no address at all: first sender", socks5.Addr{},
			[]string{"127.0.0.1:5001", "127.0.0.1:5000"}, []bool{true, false}},
		{"declared address and port", socks5.Addr{IP: control, Port: 5000},
			[]string{"127.0.0.1:5001", "127.0.0.1:5000", "127.0.0.1:5001"}, []bool{false, true, false}},
		{"declared port on the control address", socks5.Addr{IP: netip.IPv4Unspecified(), Port: 5000},
			[]string{"127.0.0.1:5001", "127.0.0.1:5000"}, []bool{false, true}},
		{"declared address, first port", socks5.Addr{IP: netip.MustParseAddr("127.0.0.3")},
			[]string{"127.0.0.1:5000", "127.0.0.3:6000", "127.0.0.3:6001"}, []bool{false, true, false}},
		{"IPv4-mapped source", socks5.Addr{IP: control, Port: 5000},
			[]string{"[::ffff:127.0.0.1]:5000"}, []bool{true}},
		{"declared by name: control address, declared port", socks5.Addr{Host: "localhost", Port: 5000},
			[]string{"127.0.0.1:5000", "127.0.0.1:5001"}, []bool{true, false}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := newAssociateSource(tc.declared, control)
			var got []bool
			for _, p := range tc.packets {
				got = append(got, s.accept(ap(p)))
			}
			assert.Equal(t, tc.want, got)
		})
	}
}
