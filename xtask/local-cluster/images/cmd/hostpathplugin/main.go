// Command hostpathplugin provides the proxy mode of the csi-driver-host-path binary of the same name,
// which the DRA e2e driver execs inside its proxy pods:
//
//	/hostpathplugin --v=5 --endpoint=<unix socket> --proxy-endpoint=tcp://:<port>
//
// It listens on both endpoints and splices the n-th connection accepted on the Unix socket (from the
// kubelet) with the next connection accepted on the TCP port (from the test process, through the API
// server's port-forward). There is no handshake: pairing is by accept order, and bytes are copied
// unchanged. When either side of a pair ends, both connections are closed.
//
// The upstream module (github.com/kubernetes-csi/csi-driver-host-path) is not served by the Go module
// proxy that this project's machines can reach, so the local cluster builds this stand-in with the
// same command line and behaviour for the flags the e2e driver uses. Only the proxy mode exists here.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
)

var (
	endpoint      = flag.String("endpoint", "unix:///tmp/csi.sock", "The socket the kubelet connects to (unix://path, tcp://host:port, or a plain Unix socket path).")
	proxyEndpoint = flag.String("proxy-endpoint", "", "Proxy connections from --endpoint to this listening socket (tcp://:port). Required: this build only implements the proxy mode.")
	verbosity     = flag.Int("v", 0, "Log verbosity; 5 logs every connection.")
	_             = flag.String("drivername", "", "Accepted for compatibility; unused in proxy mode.")
	_             = flag.String("nodeid", "", "Accepted for compatibility; unused in proxy mode.")
)

func main() {
	flag.Parse()
	log.SetFlags(log.Ldate | log.Ltime | log.Lmicroseconds)
	if *proxyEndpoint == "" {
		log.Fatal("--proxy-endpoint is required: this hostpathplugin build only implements the proxy mode")
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP, syscall.SIGQUIT)
	defer stop()
	if err := run(ctx, *endpoint, *proxyEndpoint); err != nil {
		log.Fatalf("proxy: %v", err)
	}
}

// parseEndpoint splits "unix://path", "tcp://addr" (case-insensitive scheme) or a bare path.
func parseEndpoint(ep string) (network, address string) {
	lower := strings.ToLower(ep)
	switch {
	case strings.HasPrefix(lower, "unix://"):
		return "unix", ep[len("unix://"):]
	case strings.HasPrefix(lower, "tcp://"):
		return "tcp", ep[len("tcp://"):]
	default:
		return "unix", ep
	}
}

func listen(ep string) (net.Listener, func(), error) {
	network, address := parseEndpoint(ep)
	cleanup := func() {}
	if network == "unix" {
		if err := os.Remove(address); err != nil && !errors.Is(err, os.ErrNotExist) {
			return nil, nil, fmt.Errorf("remove stale socket %s: %w", address, err)
		}
		cleanup = func() { _ = os.Remove(address) }
	}
	l, err := net.Listen(network, address)
	if err != nil {
		return nil, nil, fmt.Errorf("listen on %s: %w", ep, err)
	}
	return l, cleanup, nil
}

func run(ctx context.Context, ep1, ep2 string) error {
	first, cleanup1, err := listen(ep1)
	if err != nil {
		return err
	}
	defer cleanup1()
	second, cleanup2, err := listen(ep2)
	if err != nil {
		first.Close()
		return err
	}
	defer cleanup2()
	logf(1, "proxying between %s and %s", first.Addr(), second.Addr())

	go func() {
		<-ctx.Done()
		first.Close()
		second.Close()
	}()

	var wg sync.WaitGroup
	defer wg.Wait()
	for n := 1; ; n++ {
		c1, err := accept(ctx, first)
		if err != nil {
			return nil
		}
		c2, err := accept(ctx, second)
		if err != nil {
			c1.Close()
			return nil
		}
		logf(5, "connection #%d: %s <-> %s", n, c1.RemoteAddr(), c2.RemoteAddr())
		wg.Add(1)
		go func(n int) {
			defer wg.Done()
			splice(c1, c2)
			logf(5, "connection #%d closed", n)
		}(n)
	}
}

// accept retries transient accept errors until the context ends.
func accept(ctx context.Context, l net.Listener) (net.Conn, error) {
	for {
		c, err := l.Accept()
		if err == nil {
			return c, nil
		}
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		logf(2, "accept on %s: %v", l.Addr(), err)
	}
}

// splice copies both directions and closes both connections as soon as either direction ends.
func splice(a, b net.Conn) {
	var once sync.Once
	closeBoth := func() { once.Do(func() { a.Close(); b.Close() }) }
	done := make(chan struct{}, 2)
	copyOne := func(dst, src net.Conn) {
		_, _ = io.Copy(dst, src)
		closeBoth()
		done <- struct{}{}
	}
	go copyOne(a, b)
	go copyOne(b, a)
	<-done
	<-done
}

func logf(level int, format string, args ...any) {
	if *verbosity >= level {
		log.Printf(format, args...)
	}
}
