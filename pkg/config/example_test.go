package config_test

import (
	"fmt"
	"os"
	"time"

	"github.com/spf13/pflag"

	"github.com/quictun/quictun/pkg/config"
)

func ExampleLoad() {
	f, err := os.CreateTemp("", "c-*.yaml")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer func() { _ = os.Remove(f.Name()) }()
	_, _ = f.WriteString("server-endpoint: a:7500\ndrain-timeout: 10s\n")
	_ = f.Close()

	fs := pflag.NewFlagSet("client", pflag.ContinueOnError)
	endpoint := fs.String("server-endpoint", "127.0.0.1:7500", "QUIC server HOST:PORT")
	drain := fs.Duration("drain-timeout", 30*time.Second, "drain time")
	_ = fs.Parse([]string{"--drain-timeout=1m"})
	env := map[string]string{"QUICTUN_SERVER_ENDPOINT": "b:7500"}
	lookup := func(k string) (string, bool) { v, ok := env[k]; return v, ok }

	if err := config.Load(fs, f.Name(), "QUICTUN", lookup); err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(*endpoint, *drain)
	// Output: b:7500 1m0s
}
