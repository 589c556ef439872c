// Command go-client is a grpc-go client of a DRA kubelet plugin, dialing the way the kubelet
// does (k8s.io/kubernetes v1.37.2).
//
//	go-client <registration socket>
//	go-client register <registration socket>
//
// registers like the kubelet's plugin watcher
// (pkg/kubelet/pluginmanager/operationexecutor/operation_generator.go): it dials the
// registration socket with the same options (a passthrough target, so grpc-go sends the
// percent-encoded socket path as :authority), calls GetInfo with a 1 s timeout and then
// NotifyRegistrationStatus(registered) on the same connection, and prints the PluginInfo it got
// as one JSON line.
//
//	go-client calls <socket> <passthrough|unix>
//
// dials a socket either with a passthrough target (as kubelets before v1.36 re-dial the DRA
// socket for the health stream) or with a "unix:" target (grpc-go's unix resolver, which sends
// "localhost", as the kubelet's DRA client), reads calls from stdin, one JSON object a line
// ({"method": "/v1.DRAPlugin/NodePrepareResources", "request": "<base64>", "stream": false}), makes
// them in order on one connection and prints one JSON line for each
// ({"code": 0, "message": "", "response": "<base64>"}); for a server stream, the first message.
//
//	go-client bench <socket> <passthrough|unix> <n>
//
// reads calls the same way and makes them n times in turn on one connection (after one round
// that connects), then prints each round's latency as one JSON line ({"latencies_ns": [..]}).
//
// It needs no generated code: messages are passed through as bytes by a codec registered under
// the name "proto", so the request headers are those of the kubelet's generated client.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/status"
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

// call is one call read from stdin.
type call struct {
	Method  string `json:"method"`
	Request []byte `json:"request"`
	Stream  bool   `json:"stream"`
}

// result is what one call returned.
type result struct {
	Code     uint32 `json:"code"`
	Message  string `json:"message"`
	Response []byte `json:"response"`
}

// dialTarget connects to socketPath with a passthrough target (the percent-encoded path is the
// :authority) or a "unix:" target (grpc-go's unix resolver: "localhost").
func dialTarget(socketPath, target string) (*grpc.ClientConn, error) {
	switch target {
	case "passthrough":
		return dial(context.Background(), socketPath, dialTimeoutDuration)
	case "unix":
		return grpc.NewClient("unix:"+socketPath, grpc.WithTransportCredentials(insecure.NewCredentials()))
	default:
		return nil, fmt.Errorf("unknown target kind %q (passthrough or unix)", target)
	}
}

func readCalls() ([]call, error) {
	var calls []call
	scanner := bufio.NewScanner(os.Stdin)
	scanner.Buffer(nil, 256<<20)
	for scanner.Scan() {
		var c call
		if err := json.Unmarshal(scanner.Bytes(), &c); err != nil {
			return nil, fmt.Errorf("bad call line: %v", err)
		}
		calls = append(calls, c)
	}
	return calls, scanner.Err()
}

func invoke(conn *grpc.ClientConn, c call) result {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var reply rawMessage
	var err error
	if c.Stream {
		var stream grpc.ClientStream
		stream, err = conn.NewStream(ctx, &grpc.StreamDesc{ServerStreams: true}, c.Method)
		if err == nil {
			err = stream.SendMsg(&rawMessage{bytes: c.Request})
		}
		if err == nil {
			err = stream.CloseSend()
		}
		if err == nil {
			err = stream.RecvMsg(&reply)
		}
	} else {
		err = conn.Invoke(ctx, c.Method, &rawMessage{bytes: c.Request}, &reply)
	}
	st := status.Convert(err)
	return result{Code: uint32(st.Code()), Message: st.Message(), Response: reply.bytes}
}

// callsAndConnection reads the calls from stdin and dials the socket.
func callsAndConnection(socketPath, target string) ([]call, *grpc.ClientConn, error) {
	calls, err := readCalls()
	if err != nil {
		return nil, nil, err
	}
	conn, err := dialTarget(socketPath, target)
	return calls, conn, err
}

func runCalls(socketPath, target string) error {
	calls, conn, err := callsAndConnection(socketPath, target)
	if err != nil {
		return err
	}
	defer conn.Close()
	out := json.NewEncoder(os.Stdout)
	for _, c := range calls {
		if err := out.Encode(invoke(conn, c)); err != nil {
			return err
		}
	}
	return nil
}

func runBench(socketPath, target string, rounds int) error {
	calls, conn, err := callsAndConnection(socketPath, target)
	if err != nil {
		return err
	}
	defer conn.Close()
	latencies := make([]int64, 0, rounds)
	// Round 0 connects and is not measured.
	for i := 0; i <= rounds; i++ {
		start := time.Now()
		for _, c := range calls {
			if r := invoke(conn, c); r.Code != 0 {
				return fmt.Errorf("round %d: %s: code %d: %s", i, c.Method, r.Code, r.Message)
			}
		}
		if i > 0 {
			latencies = append(latencies, time.Since(start).Nanoseconds())
		}
	}
	return json.NewEncoder(os.Stdout).Encode(map[string][]int64{"latencies_ns": latencies})
}

func main() {
	encoding.RegisterCodec(rawCodec{})
	args := os.Args[1:]
	var err error
	switch {
	case len(args) == 1:
		err = run(args[0])
	case len(args) == 2 && args[0] == "register":
		err = run(args[1])
	case len(args) == 3 && args[0] == "calls":
		err = runCalls(args[1], args[2])
	case len(args) == 4 && args[0] == "bench":
		rounds, convErr := strconv.Atoi(args[3])
		if convErr != nil || rounds < 1 {
			fmt.Fprintln(os.Stderr, "bench: the number of rounds must be a positive integer")
			os.Exit(2)
		}
		err = runBench(args[1], args[2], rounds)
	default:
		fmt.Fprintln(os.Stderr, "usage: go-client [register] <registration socket> | calls <socket> <passthrough|unix> | bench <socket> <passthrough|unix> <n>")
		os.Exit(2)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
