//go:build k8s_1_34

// The kubelet code of Kubernetes 1.34: no contexts in the plugin manager and its handlers
// or in the DRA manager's node getter, no DRA manager Stop, and Claim.UID (Uid from 1.35).

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
	return func() (*v1.Node, error) {
		return client.CoreV1().Nodes().Get(context.Background(), name, metav1.GetOptions{})
	}
}

func runPlugins(_ context.Context, plugins pluginmanager.PluginManager, stop chan struct{}) {
	plugins.Run(sourcesReady{}, stop)
}

func stopManager(*dra.Manager) {}

func newClaim(namespace, name, uid string) *drapbv1.Claim {
	return &drapbv1.Claim{Namespace: namespace, Name: name, UID: uid}
}

func claimUID(claim *drapbv1.Claim) string { return claim.UID }

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
