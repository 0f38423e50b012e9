package resume

import (
	"bytes"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quictun/quictun/pkg/proto"
)

func TestRequestToken(t *testing.T) {
	t.Parallel()
	id, err := NewID()
	require.NoError(t, err)
	r := Request{ID: id, Offset: 1<<40 + 3}
	tok := r.Token()
	require.LessOrEqual(t, len(tok), proto.MaxTokenLen)
	got, err := ParseRequest(tok)
	require.NoError(t, err)
	assert.Equal(t, r, got)
	for _, bad := range []string{
		"", "tcp:127.0.0.1:22", "resume/1/", "resume/2/" + id.String() + "/0",
		"resume/1/" + id.String(), "resume/1/" + id.String()[:30] + "/0",
		"resume/1/" + id.String() + "/-1", "resume/1/" + id.String() + "/18446744073709551616",
		"resume/1/zz" + id.String()[2:] + "/0",
	} {
		_, err := ParseRequest(bad)
		require.ErrorIs(t, err, ErrBadRequest, "%q", bad)
	}
}

func TestReply(t *testing.T) {
	t.Parallel()
	b := AppendReply(nil, 123456789)
	require.Len(t, b, ReplyLen)
	off, err := ReadReply(bytes.NewReader(b))
	require.NoError(t, err)
	assert.Equal(t, uint64(123456789), off)
	b[0] = byte(proto.CodeRefused)
	_, err = ReadReply(bytes.NewReader(b))
	require.ErrorIs(t, err, ErrBadRequest)
	_, err = ReadReply(bytes.NewReader(b[:4]))
	require.Error(t, err)
}

func TestAcks(t *testing.T) {
	t.Parallel()
	var acks []Ack
	for i := range 100 {
		acks = append(acks, Ack{ID: ID{byte(i)}, Offset: uint64(i) * 1000})
	}
	var got []Ack
	for rest := acks; len(rest) > 0; {
		var d []byte
		d, rest = AppendAcks(nil, rest)
		require.LessOrEqual(t, len(d), 1200)
		require.NoError(t, ParseAcks(d, func(a Ack) { got = append(got, a) }))
	}
	assert.Equal(t, acks, got)
	for _, bad := range [][]byte{nil, {TypeAck, 1}, {'U'}, append([]byte{TypeAck}, make([]byte, (MaxAcksPerDatagram+1)*AckLen)...)} {
		require.ErrorIs(t, ParseAcks(bad, func(Ack) { t.Fatal("no ack from a bad datagram") }), ErrBadRequest)
	}
}
