// Command kube is a multi-call binary holding the Kubernetes components and etcd that the local
// cluster runs: `kube <component> [flags]`, with component one of etcd, kube-apiserver,
// kube-controller-manager, kube-scheduler, kubelet, or cri-reset (the clean-up step of `cluster
// down`). One binary means one link instead of five,
// which matters for the cold build time on two cores.
package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"go.etcd.io/etcd/server/v3/etcdmain"
	"k8s.io/component-base/cli"
	_ "k8s.io/component-base/logs/json/register"
	_ "k8s.io/component-base/metrics/prometheus/clientgo"
	_ "k8s.io/component-base/metrics/prometheus/version"
	apiserver "k8s.io/kubernetes/cmd/kube-apiserver/app"
	controllermanager "k8s.io/kubernetes/cmd/kube-controller-manager/app"
	scheduler "k8s.io/kubernetes/cmd/kube-scheduler/app"
	kubelet "k8s.io/kubernetes/cmd/kubelet/app"
)

// components are the names main answers to, as its first argument or as its own name.
var components = map[string]bool{
	"etcd": true, "kube-apiserver": true, "kube-controller-manager": true, "kube-scheduler": true,
	"kubelet": true, "cri-reset": true,
}

func main() {
	if self := filepath.Base(os.Args[0]); components[self] {
		// Called through a link: insert the component as if it were the first argument.
		os.Args = append([]string{"kube", self}, os.Args[1:]...)
	}
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: kube etcd|kube-apiserver|kube-controller-manager|kube-scheduler|kubelet|cri-reset [flags]")
		os.Exit(2)
	}
	component := os.Args[1]
	// Each component parses os.Args[1:] as its own flags, so drop the component name.
	os.Args = append([]string{component}, os.Args[2:]...)
	switch component {
	case "etcd":
		etcdmain.Main(os.Args)
	case "kube-apiserver":
		os.Exit(cli.Run(apiserver.NewAPIServerCommand()))
	case "kube-controller-manager":
		os.Exit(cli.Run(controllermanager.NewControllerManagerCommand()))
	case "kube-scheduler":
		os.Exit(cli.Run(scheduler.NewSchedulerCommand()))
	case "kubelet":
		os.Exit(cli.Run(kubelet.NewKubeletCommand(context.Background())))
	case "cri-reset":
		os.Exit(criReset(os.Args[1:]))
	default:
		fmt.Fprintf(os.Stderr, "kube: unknown component %q\n", component)
		os.Exit(2)
	}
}
