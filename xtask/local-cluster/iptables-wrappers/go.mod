// Our own implementation of the part of sigs.k8s.io/iptables-wrappers that Kubernetes v1.38's
// kubelet imports (pkg/kubelet/kubelet_network_linux.go). The Go module proxy this project's
// machines reach refuses that module's zip (403), so builds of v1.38 or later replace it with this
// directory when, and only when, the proxy refuses it (xtask/src/kube_module.rs).
module sigs.k8s.io/iptables-wrappers

go 1.24
