// Package config fills a pflag.FlagSet from a strict YAML file and the
// environment, and writes the effective configuration back out as YAML.
//
// Precedence, lowest first: flag defaults < YAML file < environment < flags
// set on the command line. YAML keys are the long flag names (as in
// quic-tun's configs), and environment variables are PREFIX_NAME with '-'
// replaced by '_' (QUICTUN_SERVER_ENDPOINT for --server-endpoint).
//
// The package imports only the standard library, pflag and yaml.v3.
package config
