//go:build k8s_before_1_36

// Before Kubernetes 1.36 the DRA manager's node getter takes no context.

package main

import (
	"context"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/kubernetes/pkg/kubelet/cm/dra"
)

func nodeGetter(client kubernetes.Interface, name string) dra.GetNodeFunc {
	return func() (*v1.Node, error) {
		return client.CoreV1().Nodes().Get(context.Background(), name, metav1.GetOptions{})
	}
}
