//go:build !k8s_1_34

// What the harness calls that changed between the Kubernetes releases it is built for:
// this file for the newest (1.37), kubelet_1_34.go for 1.34 (build tag k8s_1_34).

package main

import (
	"context"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	drapbv1 "k8s.io/kubelet/pkg/apis/dra/v1"
	"k8s.io/kubernetes/pkg/kubelet/cm/dra"
	"k8s.io/kubernetes/pkg/kubelet/pluginmanager"
)

func nodeGetter(client kubernetes.Interface, name string) dra.GetNodeFunc {
	return func(ctx context.Context) (*v1.Node, error) {
		return client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
	}
}

func runPlugins(ctx context.Context, plugins pluginmanager.PluginManager, stop chan struct{}) {
	plugins.Run(ctx, sourcesReady{}, stop)
}

func stopManager(manager *dra.Manager) { manager.Stop() }

func newClaim(namespace, name, uid string) *drapbv1.Claim {
	return &drapbv1.Claim{Namespace: namespace, Name: name, Uid: uid}
}

func claimUID(claim *drapbv1.Claim) string { return claim.Uid }

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
