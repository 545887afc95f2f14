//go:build k8s_before_1_35

// Before Kubernetes 1.35 the plugin manager's Run takes no context, and a claim's UID is
// Claim.UID (Uid from 1.35).

package main

import (
	"context"

	drapbv1 "k8s.io/kubelet/pkg/apis/dra/v1"
	"k8s.io/kubernetes/pkg/kubelet/pluginmanager"
)

func runPlugins(_ context.Context, plugins pluginmanager.PluginManager, stop chan struct{}) {
	plugins.Run(sourcesReady{}, stop)
}

func newClaim(namespace, name, uid string) *drapbv1.Claim {
	return &drapbv1.Claim{Namespace: namespace, Name: name, UID: uid}
}

func claimUID(claim *drapbv1.Claim) string { return claim.UID }
