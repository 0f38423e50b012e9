package udpflow

import "time"

// SetSenderClock makes s read the time from now (tests).
func SetSenderClock(s *Sender, now func() time.Time) { s.now = now }

const DatagramRetryMin, DatagramRetryMax = datagramRetryMin, datagramRetryMax
