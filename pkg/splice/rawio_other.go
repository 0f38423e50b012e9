//go:build !linux

package splice

// rawIO is Linux only; elsewhere the Pipe uses the connection's Read and Write.
type rawIO struct{}

func newRawIO(Conn) *rawIO { return nil }

func (*rawIO) read([]byte) (int, error)  { panic("splice: rawIO is Linux only") }
func (*rawIO) write([]byte) (int, error) { panic("splice: rawIO is Linux only") }
