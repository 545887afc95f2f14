package main

// The bench_prepare op: the benchmarks' way to time a DRA driver's
// NodePrepareResources and NodeUnprepareResources exactly as the kubelet
// calls them, without the pod bookkeeping of PrepareResources around them.
//
// It asks the kubelet's DRA plugin manager for the registered plugin of a
// driver (DRAPluginManager.GetPlugin, what Manager.prepareResources uses) and
// calls the plugin's client wrapper, so each call goes over the same gRPC
// connection, service choice, interceptors and timeout as a kubelet's. The
// claims must exist and be allocated to the driver; every call must succeed
// for every claim, otherwise the op fails instead of timing errors.
// Durations are taken around the client wrapper's calls, so they include
// what a kubelet waits for: gRPC over the Unix socket and the driver's work.

import (
	"context"
	"fmt"
	"sync"
	"time"

	drapbv1 "k8s.io/kubelet/pkg/apis/dra/v1"
	draplugin "k8s.io/kubernetes/pkg/kubelet/cm/dra/plugin"
)

// benchClaim names one ResourceClaim of a bench_prepare request.
type benchClaim struct {
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	UID       string `json:"uid"`
}

// benchPrepare runs req.Warmup untimed and then req.Iterations timed
// rounds of one NodePrepareResources for all req.Claims followed by one
// NodeUnprepareResources for them, and answers the duration of every timed
// call in nanoseconds and the wall time of the timed rounds.
//
// With req.Parallel > 1 the claims are dealt into that many groups and each
// group runs its rounds in a goroutine of its own, as a kubelet prepares the
// claims of pods that start together: the answer then also measures how the
// driver copes with concurrent requests. The warmup runs before, one group
// after the other.
func (h *harness) benchPrepare(ctx context.Context, req request) (map[string]any, error) {
	parallel := max(req.Parallel, 1)
	if req.Driver == "" || len(req.Claims) < parallel || req.Iterations <= 0 || req.Warmup < 0 {
		return nil, fmt.Errorf("bench_prepare needs a driver, at least parallel claims, iterations > 0 and warmup >= 0")
	}
	plugins, ok := h.manager.GetWatcherHandler().(*draplugin.DRAPluginManager)
	if !ok {
		return nil, fmt.Errorf("the DRA manager's watcher handler is a %T, not the plugin manager", h.manager.GetWatcherHandler())
	}
	plugin, err := plugins.GetPlugin(req.Driver)
	if err != nil {
		return nil, err
	}
	groups := make([][]*drapbv1.Claim, parallel)
	for i, c := range req.Claims {
		groups[i%parallel] = append(groups[i%parallel], newClaim(c.Namespace, c.Name, c.UID))
	}
	for _, group := range groups {
		if _, _, err := benchRounds(ctx, plugin, group, req.Warmup); err != nil {
			return nil, fmt.Errorf("warmup: %w", err)
		}
	}

	results := make([]struct {
		prepare, unprepare []int64
		err                error
	}, parallel)
	var wg sync.WaitGroup
	started := time.Now()
	for i, group := range groups {
		wg.Go(func() {
			results[i].prepare, results[i].unprepare, results[i].err = benchRounds(ctx, plugin, group, req.Iterations)
		})
	}
	wg.Wait()
	total := time.Since(started)
	prepareNs := make([]int64, 0, req.Iterations*parallel)
	unprepareNs := make([]int64, 0, req.Iterations*parallel)
	for _, r := range results {
		if r.err != nil {
			return nil, r.err
		}
		prepareNs = append(prepareNs, r.prepare...)
		unprepareNs = append(unprepareNs, r.unprepare...)
	}
	return map[string]any{
		"prepare_ns":   prepareNs,
		"unprepare_ns": unprepareNs,
		"total_ns":     total.Nanoseconds(),
	}, nil
}

// benchRounds prepares then unprepares claims n times, timing each call.
func benchRounds(ctx context.Context, plugin *draplugin.DRAPlugin, claims []*drapbv1.Claim, n int) ([]int64, []int64, error) {
	prepareReq := &drapbv1.NodePrepareResourcesRequest{Claims: claims}
	unprepareReq := &drapbv1.NodeUnprepareResourcesRequest{Claims: claims}
	prepareNs := make([]int64, 0, n)
	unprepareNs := make([]int64, 0, n)
	for i := range n {
		t0 := time.Now()
		prepared, err := plugin.NodePrepareResources(ctx, prepareReq)
		t1 := time.Now()
		if err := checkPrepared(prepared, err, claims); err != nil {
			return nil, nil, fmt.Errorf("round %d: NodePrepareResources: %w", i, err)
		}
		t2 := time.Now()
		unprepared, err := plugin.NodeUnprepareResources(ctx, unprepareReq)
		t3 := time.Now()
		if err := checkUnprepared(unprepared, err, claims); err != nil {
			return nil, nil, fmt.Errorf("round %d: NodeUnprepareResources: %w", i, err)
		}
		prepareNs = append(prepareNs, t1.Sub(t0).Nanoseconds())
		unprepareNs = append(unprepareNs, t3.Sub(t2).Nanoseconds())
	}
	return prepareNs, unprepareNs, nil
}

func checkPrepared(resp *drapbv1.NodePrepareResourcesResponse, err error, claims []*drapbv1.Claim) error {
	if err != nil {
		return err
	}
	for _, claim := range claims {
		answer := resp.GetClaims()[claimUID(claim)]
		switch {
		case answer == nil:
			return fmt.Errorf("no answer for claim %s/%s", claim.Namespace, claim.Name)
		case answer.Error != "":
			return fmt.Errorf("claim %s/%s: %s", claim.Namespace, claim.Name, answer.Error)
		case len(answer.Devices) == 0:
			return fmt.Errorf("claim %s/%s: prepared without devices", claim.Namespace, claim.Name)
		}
	}
	return nil
}

func checkUnprepared(resp *drapbv1.NodeUnprepareResourcesResponse, err error, claims []*drapbv1.Claim) error {
	if err != nil {
		return err
	}
	for _, claim := range claims {
		answer := resp.GetClaims()[claimUID(claim)]
		switch {
		case answer == nil:
			return fmt.Errorf("no answer for claim %s/%s", claim.Namespace, claim.Name)
		case answer.Error != "":
			return fmt.Errorf("claim %s/%s: %s", claim.Namespace, claim.Name, answer.Error)
		}
	}
	return nil
}
