package token

import (
	"encoding/base64"
	"fmt"
	"strings"

	"github.com/quictun/quictun/pkg/endpoint"
)

// PluginCleartext is the parser plugin whose tokens are endpoint strings.
const PluginCleartext = "Cleartext"

// KeyBase64 is the Cleartext parser key for std-base64 encoded tokens.
const KeyBase64 = "base64"

// Parser turns a token received from a client into a destination. Parsers
// are safe for concurrent use.
type Parser interface {
	// Parse returns the destination named by token. Errors wrap
	// ErrTokenTooLong or ErrInvalidToken.
	Parse(token string) (endpoint.Endpoint, error)
}

// NewParser returns the parser named by plugin (case-insensitive). The only
// plugin is "Cleartext": the token is "tcp:HOST:PORT" or "unix:/path", as is
// when key is "", or standard base64 (with padding) of that when key is
// "base64" (case-insensitive), as in quic-tun. Errors wrap ErrUnknownPlugin.
func NewParser(plugin, key string) (Parser, error) {
	if !strings.EqualFold(plugin, PluginCleartext) {
		return nil, fmt.Errorf("%w %q (want Cleartext)", ErrUnknownPlugin, plugin)
	}
	switch strings.ToLower(key) {
	case "":
		return cleartextParser{}, nil
	case KeyBase64:
		return cleartextParser{base64: true}, nil
	default:
		return nil, fmt.Errorf("%w: Cleartext key %q (want \"\" or base64)", ErrUnknownPlugin, key)
	}
}

type cleartextParser struct{ base64 bool }

func (p cleartextParser) Parse(token string) (endpoint.Endpoint, error) {
	if len(token) > MaxTokenLen {
		return endpoint.Endpoint{}, fmt.Errorf("%w: %d bytes, max %d", ErrTokenTooLong, len(token), MaxTokenLen)
	}
	if token == "" {
		return endpoint.Endpoint{}, fmt.Errorf("%w: empty", ErrInvalidToken)
	}
	s := token
	if p.base64 {
		b, err := base64.StdEncoding.Strict().DecodeString(token)
		if err != nil {
			return endpoint.Endpoint{}, fmt.Errorf("%w: base64: %w", ErrInvalidToken, err)
		}
		s = string(b)
	}
	e, err := endpoint.Parse(s)
	if err != nil {
		return endpoint.Endpoint{}, fmt.Errorf("%w: %w", ErrInvalidToken, err)
	}
	return e, nil
}
