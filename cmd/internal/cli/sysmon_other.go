//go:build !unix

package cli

import "errors"

func reexec(string, []string, []string) error { return errors.New("not supported") }
