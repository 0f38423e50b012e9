package transport

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"path/filepath"

	"github.com/quic-go/quic-go"
	"github.com/quic-go/quic-go/qlogwriter"
)

// QlogTracer returns a quic.Config.Tracer that writes one qlog file per
// connection into dir as <odcid>_<client|server>.sqlog, for qvis
// (https://qvis.quictools.info). Tracing costs throughput (about 20 % in
// quic-go), so it is off unless asked for. onError reports files that could
// not be created; the connection then runs untraced.
func QlogTracer(dir string, onError func(error)) func(context.Context, bool, quic.ConnectionID) qlogwriter.Trace {
	return func(_ context.Context, isClient bool, connID quic.ConnectionID) qlogwriter.Trace {
		role := "server"
		if isClient {
			role = "client"
		}
		path := filepath.Join(dir, fmt.Sprintf("%s_%s.sqlog", connID, role))
		f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600)
		if err != nil {
			if onError != nil {
				onError(fmt.Errorf("qlog file: %w", err))
			}
			return nil
		}
		seq := qlogwriter.NewConnectionFileSeq(&bufferedFile{Writer: bufio.NewWriter(f), f: f}, isClient, connID)
		go seq.Run() // ends when quic-go closes the trace with its connection
		return seq
	}
}

type bufferedFile struct {
	*bufio.Writer
	f *os.File
}

func (b *bufferedFile) Close() error {
	if err := b.Flush(); err != nil {
		_ = b.f.Close()
		return err
	}
	return b.f.Close()
}
