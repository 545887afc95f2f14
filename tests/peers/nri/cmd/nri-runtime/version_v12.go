//go:build !nri_v08 && !nri_v11

package main

// The v0.12 build: containerd 2.3 and 2.4, which vendor NRI v0.12.x.

import (
	"context"
	"fmt"

	"github.com/containerd/nri/pkg/api"
)

const (
	// nriLine is the NRI minor version this build is for (checked against the module).
	nriLine = "v0.12"
	// containerdLine is what containerd releases embed this NRI version.
	containerdLine = "containerd 2.3/2.4"
	// defaultRuntimeVersion is the version reported to plugins in Configure.
	defaultRuntimeVersion = "v2.4.2"
	// fillsCDIDevices: containerd fills Container.CDI_devices from 2.3 on, from the CRI
	// request's CDIDevices.
	fillsCDIDevices = true
	// sendsPodUpdates: UpdatePodSandboxResources relays UpdatePodSandbox from 2.3 on.
	sendsPodUpdates = true
)

func setCDIDevices(c *api.Container, names []string) {
	c.CDIDevices = make([]*api.CDIDevice, 0, len(names))
	for _, n := range names {
		c.CDIDevices = append(c.CDIDevices, &api.CDIDevice{Name: n})
	}
}

// updatePod is UpdatePodSandboxResources: UpdatePodSandbox is relayed (an error fails the
// call), the sandbox's resources are recorded, PostUpdatePodSandbox is relayed.
func (h *harness) updatePod(ctx context.Context, id string, overhead, res *resources) (map[string]any, error) {
	h.life.RLock()
	defer h.life.RUnlock()
	h.model.mu.Lock()
	p, ok := h.model.pods[id]
	if !ok {
		h.model.mu.Unlock()
		return nil, fmt.Errorf("%w: no pod %s", errBadRequest, id)
	}
	nriPod := p.toNRI()
	h.model.mu.Unlock()
	h.nriMu.Lock()
	_, err := h.nri.UpdatePodSandbox(ctx, &api.UpdatePodSandboxRequest{
		Pod: nriPod, OverheadLinuxResources: criToNRI(overhead), LinuxResources: criToNRI(res),
	})
	h.nriMu.Unlock()
	if err != nil {
		return nil, fmt.Errorf("NRI sandbox update failed: %w", err)
	}
	h.nriMu.Lock()
	if err := h.nri.PostUpdatePodSandbox(ctx, &api.PostUpdatePodSandboxRequest{Pod: nriPod}); err != nil {
		logf("NRI post-update notification failed: %v", err)
	}
	h.nriMu.Unlock()
	return map[string]any{}, nil
}

// setStatus fills what containerd 2.3 on reports of a container's life.
func setStatus(out *api.Container, c *container) {
	out.CreatedAt = c.createdAt
	out.StartedAt = c.startedAt
	out.FinishedAt = c.finishedAt
	out.ExitCode = c.exitCode
}
