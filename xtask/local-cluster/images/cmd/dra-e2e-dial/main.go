// Command dra-e2e-dial connects to one Unix socket and splices it with its standard input and
// output, so that a test process can talk to a socket in a pod through an exec stream:
//
//	/dra-e2e-dial <unix socket path>
//
// Bytes read from stdin go to the socket, bytes read from the socket go to stdout, unchanged.
// It exits when either side ends: 0 when the socket or stdin closed, 1 when the socket could not
// be dialed (the reason on stderr).
package main

import (
	"fmt"
	"io"
	"net"
	"os"
)

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: dra-e2e-dial <unix socket path>")
		os.Exit(2)
	}
	conn, err := net.Dial("unix", os.Args[1])
	if err != nil {
		fmt.Fprintf(os.Stderr, "dial %s: %v\n", os.Args[1], err)
		os.Exit(1)
	}
	done := make(chan struct{}, 2)
	go func() {
		_, _ = io.Copy(conn, os.Stdin)
		done <- struct{}{}
	}()
	go func() {
		_, _ = io.Copy(os.Stdout, conn)
		done <- struct{}{}
	}()
	<-done
	_ = conn.Close()
}
