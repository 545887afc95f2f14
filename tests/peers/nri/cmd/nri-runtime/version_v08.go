//go:build nri_v08

package main

// The v0.8 build: containerd 2.0 and 2.1 (and 1.7.26 on), which vendor NRI v0.8.0. Its
// Container message has no CDI_devices field, and pod and post-create/start/update and
// remove events reach plugins only through StateChange (the adaptation does that).

import (
	"context"
	"fmt"

	"github.com/containerd/nri/pkg/api"
)

const (
	nriLine               = "v0.8"
	containerdLine        = "containerd 2.0/2.1"
	defaultRuntimeVersion = "v2.1.5"
	fillsCDIDevices       = false
	sendsPodUpdates       = false
)

func setCDIDevices(*api.Container, []string) {}

func (h *harness) updatePod(context.Context, string, *resources, *resources) (map[string]any, error) {
	return nil, fmt.Errorf("%w: %s does not relay pod updates (UpdatePodSandbox comes with containerd 2.3)", errBadRequest, containerdLine)
}

// setStatus: NRI v0.8 has no timestamps or exit code in Container.
func setStatus(*api.Container, *container) {}
