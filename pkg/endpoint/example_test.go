package endpoint_test

import (
	"context"
	"errors"
	"fmt"
	"net"

	"github.com/quictun/quictun/pkg/endpoint"
)

// *net.Resolver is the production Resolver.
var _ endpoint.Resolver = (*net.Resolver)(nil)

func ExampleAllowList_Authorize() {
	allow, err := endpoint.ParseAllowList([]string{"ssh=tcp:127.0.0.1:22", "tcp:10.0.0.0/8:5432", "unix:/run/apps/*"})
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, s := range []string{"tcp:[::ffff:127.0.0.1]:22", "tcp:10.1.2.3:5432", "tcp:169.254.169.254:80", "unix:/run/apps/../../etc/shadow"} {
		dest, err := endpoint.Parse(s)
		if err != nil {
			fmt.Println(err)
			continue
		}
		dial, rule, err := allow.Authorize(context.Background(), nil, dest)
		switch {
		case errors.Is(err, endpoint.ErrForbidden):
			fmt.Println(s, "refused")
		case err != nil:
			fmt.Println(s, err)
		default:
			fmt.Println(s, "->", dial, "by", rule)
		}
	}
	// Output:
	// tcp:[::ffff:127.0.0.1]:22 -> tcp:127.0.0.1:22 by ssh
	// tcp:10.1.2.3:5432 -> tcp:10.1.2.3:5432 by rule1
	// tcp:169.254.169.254:80 refused
	// unix:/run/apps/../../etc/shadow refused
}
