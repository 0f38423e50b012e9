package token

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"os"
	"strings"
	"time"
)

// Source plugin names (matched case-insensitively by NewSource).
const (
	// PluginFixed sends the same token for every connection.
	PluginFixed = "Fixed"
	// PluginFile looks the token up by client IP in a file.
	PluginFile = "File"
	// PluginHTTP asks an HTTP service for the token.
	PluginHTTP = "Http"
)

// HTTPTimeout bounds each request made by the Http source.
const HTTPTimeout = 5 * time.Second

// maxHTTPBody is the largest Http source response body accepted.
const maxHTTPBody = 64 << 10

// maxFileSize is the largest token file accepted.
const maxFileSize = 16 << 20

// NewSource returns the token source named by plugin (case-insensitive):
//
//   - "Fixed": source is the token itself.
//   - "File": source is a file of "IP token" or "CIDR token" lines ('#'
//     starts a comment; blank lines are ignored; "* token" is a default that
//     also matches clients without an IP, such as unix socket peers). The
//     most specific (longest) prefix matching the client IP wins. The file
//     is read once, here; errors name file:line.
//   - "Http": source is an http(s) URL. Each Token call sends
//     GET URL?addr=<client IP> (other query parameters are kept; addr is
//     empty for clients without an IP), bounded by ctx and HTTPTimeout, and
//     expects status 200 with a JSON body {"token": "..."} of at most 64 KiB.
//     httpClient nil means a new http.Client with default settings.
//
// Errors wrap ErrUnknownPlugin or ErrBadSource.
func NewSource(plugin, source string, httpClient *http.Client) (Source, error) {
	switch strings.ToLower(plugin) {
	case strings.ToLower(PluginFixed):
		if err := checkConfiguredToken(source); err != nil {
			return nil, fmt.Errorf("%w: fixed token: %w", ErrBadSource, err)
		}
		return fixedSource(source), nil
	case strings.ToLower(PluginFile):
		return newFileSource(source)
	case strings.ToLower(PluginHTTP):
		return newHTTPSource(source, httpClient)
	default:
		return nil, fmt.Errorf("%w %q (want Fixed, File or Http)", ErrUnknownPlugin, plugin)
	}
}

func checkToken(tok string) error {
	if tok == "" {
		return ErrNoToken
	}
	if len(tok) > MaxTokenLen {
		return fmt.Errorf("%w: %d bytes, max %d", ErrTokenTooLong, len(tok), MaxTokenLen)
	}
	return nil
}

// checkConfiguredToken is checkToken for a token from the client's
// configuration (Fixed, File): it must also be one the server's Cleartext
// parser can read, with or without its base64 key: an endpoint
// (tcp:HOST:PORT, unix:/path) or the base64 of one. So a typo is an error
// at start, not on every connection.
func checkConfiguredToken(tok string) error {
	if err := checkToken(tok); err != nil {
		return err
	}
	_, err := cleartextParser{}.Parse(tok)
	if err == nil {
		return nil
	}
	if _, err64 := (cleartextParser{base64: true}).Parse(tok); err64 == nil {
		return nil
	}
	return fmt.Errorf("%q is not tcp:HOST:PORT, unix:/path or the base64 of one: %w", tok, err)
}

// fixedSource returns the same token for every client.
type fixedSource string

func (f fixedSource) Token(context.Context, net.Addr) (string, error) { return string(f), nil }

// fileEntry maps a prefix to a token.
type fileEntry struct {
	prefix netip.Prefix
	token  string
}

// fileSource is a longest-prefix-match table read once at construction.
type fileSource struct {
	entries []fileEntry // sorted by decreasing prefix length
	def     string      // token of the "*" line, if any
	hasDef  bool
}

func newFileSource(name string) (*fileSource, error) {
	f, err := os.Open(name)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrBadSource, err)
	}
	defer func() { _ = f.Close() }() // read-only; a close error changes nothing
	return parseTokenFile(name, io.LimitReader(f, maxFileSize+1))
}

func parseTokenFile(name string, r io.Reader) (*fileSource, error) {
	s := &fileSource{}
	seen := make(map[netip.Prefix]int)
	defLine := 0
	var errs []error
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 4096), MaxTokenLen+1024)
	total := 0
	for line := 1; sc.Scan(); line++ {
		total += len(sc.Bytes()) + 1
		if total > maxFileSize {
			return nil, fmt.Errorf("%w: %s: larger than %d bytes", ErrBadSource, name, maxFileSize)
		}
		text := sc.Text()
		if i := strings.IndexByte(text, '#'); i >= 0 {
			text = text[:i]
		}
		fields := strings.Fields(text)
		if len(fields) == 0 {
			continue
		}
		if len(fields) != 2 {
			errs = append(errs, fmt.Errorf("%s:%d: want \"IP-or-CIDR token\", got %d fields", name, line, len(fields)))
			continue
		}
		if err := checkConfiguredToken(fields[1]); err != nil {
			errs = append(errs, fmt.Errorf("%s:%d: %w", name, line, err))
			continue
		}
		if fields[0] == "*" {
			if defLine != 0 {
				errs = append(errs, fmt.Errorf("%s:%d: duplicate default entry (first on line %d)", name, line, defLine))
				continue
			}
			s.def, s.hasDef, defLine = fields[1], true, line
			continue
		}
		p, err := parsePrefix(fields[0])
		if err != nil {
			errs = append(errs, fmt.Errorf("%s:%d: %w", name, line, err))
			continue
		}
		if first, dup := seen[p]; dup {
			errs = append(errs, fmt.Errorf("%s:%d: duplicate entry for %s (first on line %d)", name, line, p, first))
			continue
		}
		seen[p] = line
		s.entries = append(s.entries, fileEntry{prefix: p, token: fields[1]})
	}
	if err := sc.Err(); err != nil {
		errs = append(errs, fmt.Errorf("%s: %w", name, err))
	}
	if len(errs) > 0 {
		return nil, fmt.Errorf("%w: %w", ErrBadSource, errors.Join(errs...))
	}
	if len(s.entries) == 0 && !s.hasDef {
		return nil, fmt.Errorf("%w: %s: no entries", ErrBadSource, name)
	}
	// Most specific first; a v4 /32 and a v6 /128 are both "exact".
	sortEntries(s.entries)
	return s, nil
}

// parsePrefix parses an IP (as a single-address prefix) or a CIDR, unmapping
// IPv4-mapped IPv6 forms.
func parsePrefix(s string) (netip.Prefix, error) {
	if strings.Contains(s, "/") {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return netip.Prefix{}, err
		}
		if p.Addr().Zone() != "" {
			return netip.Prefix{}, fmt.Errorf("zoned prefix %q not supported", s)
		}
		if p.Addr().Is4In6() && p.Bits() >= 96 {
			p = netip.PrefixFrom(p.Addr().Unmap(), p.Bits()-96)
		}
		return p.Masked(), nil
	}
	ip, err := netip.ParseAddr(s)
	if err != nil {
		return netip.Prefix{}, err
	}
	if ip.Zone() != "" {
		return netip.Prefix{}, fmt.Errorf("zoned address %q not supported", s)
	}
	ip = ip.Unmap()
	return netip.PrefixFrom(ip, ip.BitLen()), nil
}

func sortEntries(es []fileEntry) {
	// Insertion sort keeps file order among equal lengths; files are small.
	for i := 1; i < len(es); i++ {
		for j := i; j > 0 && es[j].prefix.Bits() > es[j-1].prefix.Bits(); j-- {
			es[j], es[j-1] = es[j-1], es[j]
		}
	}
}

func (s *fileSource) Token(_ context.Context, clientAddr net.Addr) (string, error) {
	if ip, ok := clientIP(clientAddr); ok {
		for _, e := range s.entries {
			if e.prefix.Contains(ip) {
				return e.token, nil
			}
		}
	}
	if s.hasDef {
		return s.def, nil
	}
	return "", fmt.Errorf("%w for client %v", ErrNoToken, clientAddr)
}

// httpSource asks a token service over HTTP.
type httpSource struct {
	url    *url.URL
	client *http.Client
}

func newHTTPSource(raw string, c *http.Client) (*httpSource, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrBadSource, err)
	}
	if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("%w: URL %q must be http:// or https:// with a host", ErrBadSource, u.Redacted())
	}
	if c == nil {
		c = &http.Client{}
	}
	return &httpSource{url: u, client: c}, nil
}

func (s *httpSource) Token(ctx context.Context, clientAddr net.Addr) (string, error) {
	u := *s.url
	q := u.Query()
	addr := ""
	if ip, ok := clientIP(clientAddr); ok {
		addr = ip.String()
	}
	q.Set("addr", addr)
	u.RawQuery = q.Encode()

	ctx, cancel := context.WithTimeout(ctx, HTTPTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return "", fmt.Errorf("token service %s: %w", s.url.Redacted(), err)
	}
	req.Header.Set("Accept", "application/json")
	resp, err := s.client.Do(req)
	if err != nil {
		return "", fmt.Errorf("token service %s: %w", s.url.Redacted(), err)
	}
	defer func() { _ = resp.Body.Close() }() // body fully read or abandoned; nothing to report
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxHTTPBody+1))
	if err != nil {
		return "", fmt.Errorf("token service %s: read body: %w", s.url.Redacted(), err)
	}
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("%w: %s: status %d", ErrBadResponse, s.url.Redacted(), resp.StatusCode)
	}
	if len(body) > maxHTTPBody {
		return "", fmt.Errorf("%w: %s: body larger than %d bytes", ErrBadResponse, s.url.Redacted(), maxHTTPBody)
	}
	var res struct {
		Token *string `json:"token"`
	}
	if err := json.Unmarshal(body, &res); err != nil {
		return "", fmt.Errorf("%w: %s: %w", ErrBadResponse, s.url.Redacted(), err)
	}
	if res.Token == nil || *res.Token == "" {
		return "", fmt.Errorf("%w: %s: %w in response", ErrBadResponse, s.url.Redacted(), ErrNoToken)
	}
	if err := checkToken(*res.Token); err != nil {
		return "", fmt.Errorf("%w: %s: %w", ErrBadResponse, s.url.Redacted(), err)
	}
	return *res.Token, nil
}
