// Command go-client registers with a DRA kubelet plugin the way the kubelet's
// plugin watcher does (k8s.io/kubernetes v1.37.2,
// pkg/kubelet/pluginmanager/operationexecutor/operation_generator.go): it dials
// the registration socket with the same options (a passthrough target, so
// grpc-go sends the percent-encoded socket path as :authority), calls GetInfo
// with a 1 s timeout and then NotifyRegistrationStatus(registered) on the same
// connection.
//
// It needs no generated code: messages are encoded by hand through a codec
// registered under the name "proto", so the request headers are those of the
// kubelet's generated client. It prints the PluginInfo it got as one JSON line.
//
// Usage: go-client <registration socket path>
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/encoding"
)

// As in operation_generator.go.
const (
	dialTimeoutDuration   = 10 * time.Second
	notifyTimeoutDuration = 5 * time.Second
)

// rawMessage is a protobuf message in wire format.
type rawMessage struct{ bytes []byte }

// rawCodec passes rawMessage bytes through; named "proto" so that the
// content-type stays "application/grpc", as with the generated client.
type rawCodec struct{}

func (rawCodec) Marshal(v any) ([]byte, error) {
	m, ok := v.(*rawMessage)
	if !ok {
		return nil, fmt.Errorf("rawCodec cannot marshal %T", v)
	}
	return m.bytes, nil
}

func (rawCodec) Unmarshal(data []byte, v any) error {
	m, ok := v.(*rawMessage)
	if !ok {
		return fmt.Errorf("rawCodec cannot unmarshal into %T", v)
	}
	m.bytes = append([]byte(nil), data...)
	return nil
}

func (rawCodec) Name() string { return "proto" }

// pluginInfo is pluginregistration.PluginInfo.
type pluginInfo struct {
	Type              string   `json:"type"`
	Name              string   `json:"name"`
	Endpoint          string   `json:"endpoint"`
	SupportedVersions []string `json:"supported_versions"`
}

// decodePluginInfo reads the string fields 1-4 of a PluginInfo message.
func decodePluginInfo(b []byte) (pluginInfo, error) {
	var info pluginInfo
	for len(b) > 0 {
		key, n := uvarint(b)
		if n == 0 {
			return info, errors.New("bad field key")
		}
		b = b[n:]
		if key&7 != 2 {
			return info, fmt.Errorf("unexpected wire type %d", key&7)
		}
		size, n := uvarint(b)
		if n == 0 || uint64(len(b)-n) < size {
			return info, errors.New("bad field length")
		}
		value := string(b[n : n+int(size)])
		b = b[n+int(size):]
		switch key >> 3 {
		case 1:
			info.Type = value
		case 2:
			info.Name = value
		case 3:
			info.Endpoint = value
		case 4:
			info.SupportedVersions = append(info.SupportedVersions, value)
		}
	}
	return info, nil
}

func uvarint(b []byte) (uint64, int) {
	var v uint64
	for i := 0; i < len(b) && i < 10; i++ {
		v |= uint64(b[i]&0x7f) << (7 * i)
		if b[i]&0x80 == 0 {
			return v, i + 1
		}
	}
	return 0, 0
}

// dial is the kubelet's dial, verbatim apart from the client it returns.
func dial(ctx context.Context, unixSocketPath string, timeout time.Duration) (*grpc.ClientConn, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()

	c, err := grpc.DialContext(ctx, unixSocketPath,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithBlock(),
		grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", addr)
		}),
	)

	if err != nil {
		return nil, fmt.Errorf("failed to dial socket %s, err: %v", unixSocketPath, err)
	}

	return c, nil
}

func run(socketPath string) error {
	encoding.RegisterCodec(rawCodec{})
	ctx := context.Background()

	conn, err := dial(ctx, socketPath, dialTimeoutDuration)
	if err != nil {
		return fmt.Errorf("RegisterPlugin error -- dial failed at socket %s, err: %v", socketPath, err)
	}
	defer conn.Close()

	ctxWithTimeout, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	var reply rawMessage
	// InfoRequest has no fields.
	if err := conn.Invoke(ctxWithTimeout, "/pluginregistration.Registration/GetInfo", &rawMessage{}, &reply); err != nil {
		return fmt.Errorf("RegisterPlugin error -- failed to get plugin info using RPC GetInfo at socket %s, err: %v", socketPath, err)
	}
	info, err := decodePluginInfo(reply.bytes)
	if err != nil {
		return fmt.Errorf("cannot decode PluginInfo: %v", err)
	}

	notifyCtx, cancelNotify := context.WithTimeout(ctx, notifyTimeoutDuration)
	defer cancelNotify()
	// RegistrationStatus{plugin_registered: true}.
	status := &rawMessage{bytes: []byte{0x08, 0x01}}
	if err := conn.Invoke(notifyCtx, "/pluginregistration.Registration/NotifyRegistrationStatus", status, &rawMessage{}); err != nil {
		return fmt.Errorf("RegisterPlugin error -- failed to send registration status at socket %s, err: %v", socketPath, err)
	}

	out, err := json.Marshal(info)
	if err != nil {
		return err
	}
	fmt.Println(string(out))
	return nil
}

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: go-client <registration socket path>")
		os.Exit(2)
	}
	if err := run(os.Args[1]); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
