//go:build !k8s_before_1_37

// What the harness calls that changed between the Kubernetes releases it is built for is in
// the kubelet_before_1_<minor>.go files and their kubelet_since_1_<minor>.go counterparts: a
// build at an older release gets the tag k8s_before_1_<minor> for every later minor release
// (tests/peers/build.py).

package main

import (
	"context"
	"time"

	"k8s.io/kubernetes/pkg/kubelet/cm/dra"
)

func stopManager(manager *dra.Manager) { manager.Stop() }

func (h *observingHandler) ValidatePlugin(ctx context.Context, name, endpoint string, versions []string) error {
	return h.validated(name, h.inner.ValidatePlugin(ctx, name, endpoint, versions))
}

func (h *observingHandler) RegisterPlugin(ctx context.Context, name, endpoint string, versions []string, timeout *time.Duration) error {
	return h.registeredWith(name, endpoint, versions, h.inner.RegisterPlugin(ctx, name, endpoint, versions, timeout))
}

func (h *observingHandler) DeRegisterPlugin(ctx context.Context, name, endpoint string) {
	h.inner.DeRegisterPlugin(ctx, name, endpoint)
	h.obs.unregistered(name, endpoint)
}
