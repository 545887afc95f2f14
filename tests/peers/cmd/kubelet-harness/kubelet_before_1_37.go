//go:build k8s_before_1_37

// Before Kubernetes 1.37 the DRA manager has no Stop, and the plugin manager's handlers
// take no context.

package main

import (
	"time"

	"k8s.io/kubernetes/pkg/kubelet/cm/dra"
)

func stopManager(*dra.Manager) {}

func (h *observingHandler) ValidatePlugin(name, endpoint string, versions []string) error {
	return h.validated(name, h.inner.ValidatePlugin(name, endpoint, versions))
}

func (h *observingHandler) RegisterPlugin(name, endpoint string, versions []string, timeout *time.Duration) error {
	return h.registeredWith(name, endpoint, versions, h.inner.RegisterPlugin(name, endpoint, versions, timeout))
}

func (h *observingHandler) DeRegisterPlugin(name, endpoint string) {
	h.inner.DeRegisterPlugin(name, endpoint)
	h.obs.unregistered(name, endpoint)
}
