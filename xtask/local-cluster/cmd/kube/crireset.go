package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"time"

	"go.opentelemetry.io/otel/trace/noop"
	criclient "k8s.io/cri-client/pkg"
)

// criReset stops and removes every pod sandbox (and any container left) of a CRI runtime, so that
// the runtime tears down their networks, mounts and shims itself before it is stopped. `cluster
// down` runs it after stopping the kubelet: `kube cri-reset --endpoint unix:///path/containerd.sock`.
func criReset(args []string) int {
	flags := flag.NewFlagSet("cri-reset", flag.ContinueOnError)
	endpoint := flags.String("endpoint", "", "CRI endpoint, e.g. unix:///run/dra-e2e/containerd/containerd.sock")
	timeout := flags.Duration("timeout", 2*time.Minute, "Give up after this long.")
	if err := flags.Parse(args); err != nil {
		return 2
	}
	if *endpoint == "" {
		fmt.Fprintln(os.Stderr, "cri-reset: --endpoint is required")
		return 2
	}
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	runtime, err := criclient.NewRemoteRuntimeService(ctx, *endpoint, 10*time.Second, noop.NewTracerProvider(), false)
	if err != nil {
		fmt.Fprintf(os.Stderr, "cri-reset: connect to %s: %v\n", *endpoint, err)
		return 1
	}
	sandboxes, err := runtime.ListPodSandbox(ctx, nil)
	if err != nil {
		fmt.Fprintf(os.Stderr, "cri-reset: list pod sandboxes: %v\n", err)
		return 1
	}
	failed := 0
	for _, s := range sandboxes {
		name := s.Id
		if s.Metadata != nil {
			name = s.Metadata.Namespace + "/" + s.Metadata.Name
		}
		if err := runtime.StopPodSandbox(ctx, s.Id); err != nil {
			fmt.Fprintf(os.Stderr, "cri-reset: stop pod %s: %v\n", name, err)
			failed++
			continue
		}
		if err := runtime.RemovePodSandbox(ctx, s.Id); err != nil {
			fmt.Fprintf(os.Stderr, "cri-reset: remove pod %s: %v\n", name, err)
			failed++
		}
	}
	containers, err := runtime.ListContainers(ctx, nil)
	if err != nil {
		fmt.Fprintf(os.Stderr, "cri-reset: list containers: %v\n", err)
		return 1
	}
	for _, c := range containers {
		if err := runtime.RemoveContainer(ctx, c.Id); err != nil {
			fmt.Fprintf(os.Stderr, "cri-reset: remove container %s: %v\n", c.Id, err)
			failed++
		}
	}
	fmt.Printf("cri-reset: removed %d pod sandboxes and %d leftover containers\n", len(sandboxes), len(containers))
	if failed > 0 {
		return 1
	}
	return 0
}
