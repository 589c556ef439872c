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

// listen listens on ep. For a Unix socket, the cleanup it returns removes the socket file only
// while it is still the one this process created: a proxy started in its place (a replacement
// pod's, or this proxy restarted) listens at the same path, and an old proxy that stops after
// it started (a SIGTERM that comes late) must not take the new socket away from the kubelet.
func listen(ep string) (net.Listener, func(), error) {
	network, address := parseEndpoint(ep)
	if network != "unix" {
		l, err := net.Listen(network, address)
		if err != nil {
			return nil, nil, fmt.Errorf("listen on %s: %w", ep, err)
		}
		return l, func() {}, nil
	}
	if err := os.Remove(address); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, nil, fmt.Errorf("remove stale socket %s: %w", address, err)
	}
	l, err := net.Listen(network, address)
	if err != nil {
		return nil, nil, fmt.Errorf("listen on %s: %w", ep, err)
	}
	// Go's Close would unlink the path whoever's socket is there now.
	l.(*net.UnixListener).SetUnlinkOnClose(false)
	created, err := os.Lstat(address)
	if err != nil {
		l.Close()
		return nil, nil, fmt.Errorf("stat the socket %s just created: %w", address, err)
	}
	cleanup := func() {
		now, err := os.Lstat(address)
		switch {
		case errors.Is(err, os.ErrNotExist):
		case err != nil:
			logf(1, "socket %s left in place: %v", address, err)
		case !os.SameFile(created, now):
			logf(1, "socket %s left in place: another proxy listens there now", address)
		default:
			_ = os.Remove(address)
		}
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

	open := newConnections()
	go func() {
		<-ctx.Done()
		first.Close()
		second.Close()
		// A stopped proxy ends its connections, as its exit would: the kubelet may have
		// connected again after the plugin behind the tunnel stopped, and waiting for that
		// connection to end would hold the stop until the kubelet gives up on it.
		open.closeAll()
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
		if !open.add(c1, c2) {
			return nil
		}
		logf(5, "connection #%d: %s <-> %s", n, c1.RemoteAddr(), c2.RemoteAddr())
		wg.Add(1)
		go func(n int) {
			defer wg.Done()
			splice(c1, c2)
			open.remove(c1, c2)
			logf(5, "connection #%d closed", n)
		}(n)
	}
}

// connections holds the accepted connections that are still open, so that a stop can close them.
type connections struct {
	mu     sync.Mutex
	conns  map[net.Conn]struct{}
	closed bool
}

func newConnections() *connections {
	return &connections{conns: make(map[net.Conn]struct{})}
}

// add records the connections, or closes them and returns false once closeAll has run.
func (c *connections) add(conns ...net.Conn) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		for _, conn := range conns {
			conn.Close()
		}
		return false
	}
	for _, conn := range conns {
		c.conns[conn] = struct{}{}
	}
	return true
}

func (c *connections) remove(conns ...net.Conn) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, conn := range conns {
		delete(c.conns, conn)
	}
}

// closeAll closes every recorded connection and every one added later.
func (c *connections) closeAll() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.closed = true
	for conn := range c.conns {
		conn.Close()
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
