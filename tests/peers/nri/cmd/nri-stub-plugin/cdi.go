//go:build !nri_v08

package main

import "github.com/containerd/nri/pkg/api"

// cdiNames are the CDI devices the runtime says the container got (NRI v0.10 on; only
// containerd 2.3 on fills them).
func cdiNames(c *api.Container) []string {
	names := make([]string, 0, len(c.GetCDIDevices()))
	for _, d := range c.GetCDIDevices() {
		names = append(names, d.GetName())
	}
	return names
}
