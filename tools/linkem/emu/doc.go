// Package emu is the core of linkem, a userspace link emulator.
//
// A Link decides, for each packet offered in one direction, whether it is
// dropped (and why) or when it is delivered: it applies blackouts, Bernoulli
// loss, Gilbert-Elliott burst loss, a rate limit with a bounded queue (tail
// drop), one-way delay with optional jitter, reordering and duplication. Link
// takes the current time as an argument, so its logic is tested with a fake
// clock. A Forwarder moves packets between two packet files (TUN devices in
// production, SEQPACKET socket pairs in tests) through two Links, holding each
// packet until its delivery time; it sleeps coarsely and spins the last part
// of each wait, because Go timers oversleep by about a millisecond.
// Server exposes statistics and live reconfiguration over HTTP.
package emu
