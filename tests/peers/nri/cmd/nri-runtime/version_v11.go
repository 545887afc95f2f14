//go:build nri_v11

package main

// The v0.11 build: containerd 2.2, which vendors NRI v0.11.0 (2.2.0: v0.10.0). Its
// Container message has CDI_devices, but containerd 2.2 leaves it empty, and it has no
// UpdatePodSandboxResources.

import (
	"context"
	"fmt"

	"github.com/containerd/nri/pkg/api"
)

const (
	nriLine               = "v0.11"
	containerdLine        = "containerd 2.2"
	defaultRuntimeVersion = "v2.2.1"
	fillsCDIDevices       = false
	sendsPodUpdates       = false
)

func setCDIDevices(*api.Container, []string) {}

func (h *harness) updatePod(context.Context, string, *resources, *resources) (map[string]any, error) {
	return nil, fmt.Errorf("%w: %s does not relay pod updates (UpdatePodSandbox comes with containerd 2.3)", errBadRequest, containerdLine)
}

// setStatus: containerd 2.2 leaves the timestamps and exit code of Container empty.
func setStatus(*api.Container, *container) {}
