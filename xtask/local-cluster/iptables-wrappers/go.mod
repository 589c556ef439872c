// Our own implementation of the part of sigs.k8s.io/iptables-wrappers that Kubernetes v1.38
// imports: pkg/iptables, the iptables client of the kubelet (pkg/kubelet/kubelet_network_linux.go)
// and of kube-proxy (cmd/kube-proxy, pkg/proxy/iptables, pkg/proxy/ipvs), and pkg/iptables/testing,
// the in-memory fake that kube-proxy's unit tests import (go mod tidy of a module that builds
// kube-proxy, the kubelet and kubeadm resolves it). The Go module proxy this project's machines
// reach refuses that module's zip (403), so builds of v1.38 or later replace it with this
// directory when, and only when, the proxy refuses it (xtask/src/gomod.rs). It requires only
// modules, at versions, that k8s.io/kubernetes v1.38.0-beta.0 requires itself.
module sigs.k8s.io/iptables-wrappers

go 1.24

require k8s.io/utils v0.0.0-20260626114624-be93311217bd
