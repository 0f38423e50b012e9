// Package authhook asks an operator's HTTPS service for the shared secret
// of a key ID the server does not hold (--auth-hook): POST {"keyId": HEX}
// answered 200 {"name": NAME, "secret": BASE64} (the key is then NAME's,
// and its rules, caps and quota are those the server has for key=NAME), or
// 404 (no such key). Answers are cached (TTL; refusals for NegativeTTL);
// lookups in flight are bounded (MaxInFlight: past it a lookup fails at
// once, never queues), and one key ID has at most one lookup in flight.
// The hook down, slow or answering nonsense fails the lookup (the server
// refuses the stream, fail closed) within Timeout.
package authhook
