//go:build nri_v08

package main

import "github.com/containerd/nri/pkg/api"

// cdiNames: NRI v0.8 has no CDI devices in Container; the environment is all there is.
func cdiNames(*api.Container) []string { return nil }
