//go:build !k8s_before_1_35

package main

import (
	"context"

	drapbv1 "k8s.io/kubelet/pkg/apis/dra/v1"
	"k8s.io/kubernetes/pkg/kubelet/pluginmanager"
)

func runPlugins(ctx context.Context, plugins pluginmanager.PluginManager, stop chan struct{}) {
	plugins.Run(ctx, sourcesReady{}, stop)
}

func newClaim(namespace, name, uid string) *drapbv1.Claim {
	return &drapbv1.Claim{Namespace: namespace, Name: name, Uid: uid}
}

func claimUID(claim *drapbv1.Claim) string { return claim.Uid }
