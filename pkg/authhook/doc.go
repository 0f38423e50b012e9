// Package authhook asks an operator's HTTPS service who a client is
// (--auth-hook). For a key ID the server does not hold: POST {"keyId": HEX}
// answered 200 {"name": NAME, "secret": BASE64} (the key is then NAME's,
// and its rules, caps and quota are those the server has for key=NAME), or
// 404 (no such key). For a client certificate (mutual TLS): POST
// {"subject": "CN=NAME", "sha256": HEX, "serial": HEX} answered 200 (yes,
// with optional rules, caps and quota for CN=NAME) or 403/404 (no). Answers
// are cached (TTL; refusals for NegativeTTL), key IDs and certificates (by
// their SHA-256) in one cache; lookups in flight are bounded (MaxInFlight:
// past it a lookup fails at once, never queues), and one key ID or
// certificate has at most one lookup in flight. The hook down, slow or
// answering nonsense fails the lookup (the server refuses the stream, fail
// closed) within Timeout.
package authhook
