//go:build !k8s_before_1_36

package main

import (
	"context"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/kubernetes/pkg/kubelet/cm/dra"
)

func nodeGetter(client kubernetes.Interface, name string) dra.GetNodeFunc {
	return func(ctx context.Context) (*v1.Node, error) {
		return client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
	}
}
