// Package token implements quic-tun compatible destination tokens.
//
// A client tells the server where to connect by sending a token in the stream
// header. On the client, a Source picks the token for each local connection
// ("Fixed", "File" or "Http" plugin); on the server, a Parser turns the token
// back into an endpoint.Endpoint ("Cleartext" plugin, optionally base64). The
// server must still check the result against its allow-list: a token is a
// request, not an authorisation.
//
// Sources treat tokens as secrets: they never put them in error messages. A
// Parser error may quote the decoded destination, which is not secret.
//
// The package imports only the standard library and pkg/endpoint.
package token
