// Command pause is the sandbox ("infra") container of every pod in the local cluster: it holds the
// pod's namespaces, reaps orphaned children (it is PID 1 of the pod) and exits on SIGTERM or SIGINT.
// It is built statically and imported as the image the containerd CRI plugin pins as its sandbox.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	signals := make(chan os.Signal, 8)
	signal.Notify(signals, syscall.SIGTERM, syscall.SIGINT, syscall.SIGCHLD)
	for sig := range signals {
		if sig == syscall.SIGCHLD {
			reap()
			continue
		}
		os.Exit(0)
	}
}

// reap collects every exited child so that no zombie outlives its parent in the pod.
func reap() {
	for {
		var status syscall.WaitStatus
		pid, err := syscall.Wait4(-1, &status, syscall.WNOHANG, nil)
		if pid <= 0 || err != nil {
			return
		}
	}
}
