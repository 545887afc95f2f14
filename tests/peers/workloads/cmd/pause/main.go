// Command pause is the sandbox ("pause") container of the test node's pods.
//
// A pod sandbox needs a process that holds the pod's namespaces and does nothing else. This one
// waits for SIGTERM or SIGINT and then exits 0, so that a sandbox stops at once instead of
// waiting for the runtime's kill timeout. As the first process of the sandbox it also reaps
// children that are handed to it, as an init process must.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	signals := make(chan os.Signal, 4)
	signal.Notify(signals, syscall.SIGTERM, syscall.SIGINT, syscall.SIGCHLD)
	for sig := range signals {
		if sig != syscall.SIGCHLD {
			os.Exit(0)
		}
		reapChildren()
	}
}

// reapChildren collects every child that has exited, without blocking on those still running.
func reapChildren() {
	for {
		var status syscall.WaitStatus
		pid, err := syscall.Wait4(-1, &status, syscall.WNOHANG, nil)
		if pid <= 0 || err != nil {
			return
		}
	}
}
