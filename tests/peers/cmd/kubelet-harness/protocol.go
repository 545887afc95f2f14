package main

// The request protocol: one JSON object per line on stdin, one JSON object
// per line on stdout answering it.
//
//	{"id":1,"op":"ping"}
//	  -> {"id":1,"ok":true,"node":"n1"}
//	{"id":2,"op":"prepare","namespace":"ns","pod":"p","timeout":60}
//	  -> {"id":2,"ok":true,"pod_uid":"...","containers":{"ctr":["vendor/class=dev"]}}
//	{"id":3,"op":"unprepare","namespace":"ns","pod":"p"}
//	  -> {"id":3,"ok":true}
//	{"id":4,"op":"plugins"}
//	  -> {"id":4,"ok":true,"plugins":[{"driver":"d","endpoint":"/.../dra.sock",
//	      "versions":["v1.DRAPlugin","v1beta1.DRAPlugin"],"chosen_service":"v1.DRAPlugin"}]}
//	{"id":5,"op":"wait_registered","driver":"d","timeout":30}
//	  -> {"id":5,"ok":true,"plugin":{...as above...}}
//	{"id":6,"op":"wait_unregistered","driver":"d","timeout":30}
//	  -> {"id":6,"ok":true}
//	{"id":9,"op":"wait_refused","driver":"d","timeout":30}
//	  -> {"id":9,"ok":true,"refusal":"...why the kubelet refused the plugin..."}
//	{"id":7,"op":"slice_wipes"}
//	  -> {"id":7,"ok":true,"wipes":[{"driver":"","field_selector":"spec.nodeName=n1"}]}
//	{"id":8,"op":"wait_slice_wipe","driver":"","timeout":30}
//	  -> {"id":8,"ok":true}    (driver "" = the start-up wipe of all drivers)
//	{"id":10,"op":"bench_prepare","driver":"d","claims":[{"namespace":"ns","name":"c","uid":"..."}],
//	 "iterations":100,"warmup":10,"parallel":1,"timeout":600}
//	  -> {"id":10,"ok":true,"prepare_ns":[...],"unprepare_ns":[...],"total_ns":N}
//	      (the plugin's NodePrepareResources then NodeUnprepareResources, timed per call,
//	      in "parallel" concurrent streams of claims; total_ns: wall time of the timed calls; bench.go)
//
// Failures answer {"id":N,"ok":false,"error":"..."}.

import (
	"context"
	"fmt"
	"time"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
)

// defaultTimeout bounds a request that names none. It is longer than the
// kubelet's own 45 s gRPC call timeout so that the kubelet's error, not
// ours, is what a test sees when a plugin hangs.
const defaultTimeout = 60 * time.Second

type request struct {
	ID        *int64  `json:"id"`
	Op        string  `json:"op"`
	Namespace string  `json:"namespace"`
	Pod       string  `json:"pod"`
	Driver    string  `json:"driver"`
	Timeout   float64 `json:"timeout"` // seconds
	// bench_prepare only (bench.go).
	Claims     []benchClaim `json:"claims"`
	Iterations int          `json:"iterations"`
	Warmup     int          `json:"warmup"`
	Parallel   int          `json:"parallel"`
}

func (r request) timeout() time.Duration {
	if r.Timeout <= 0 {
		return defaultTimeout
	}
	return time.Duration(r.Timeout * float64(time.Second))
}

func (h *harness) handle(ctx context.Context, req request) map[string]any {
	ctx, cancel := context.WithTimeout(ctx, req.timeout())
	defer cancel()

	result, err := h.dispatch(ctx, req)
	if err != nil {
		return map[string]any{"id": req.ID, "ok": false, "error": err.Error()}
	}
	if result == nil {
		result = map[string]any{}
	}
	result["id"] = req.ID
	result["ok"] = true
	return result
}

func (h *harness) dispatch(ctx context.Context, req request) (map[string]any, error) {
	switch req.Op {
	case "ping":
		return map[string]any{"node": h.nodeName}, nil
	case "prepare":
		return h.prepare(ctx, req)
	case "unprepare":
		return nil, h.unprepare(ctx, req)
	case "plugins":
		return map[string]any{"plugins": h.obs.registrations()}, nil
	case "wait_registered":
		if req.Driver == "" {
			return nil, fmt.Errorf("wait_registered needs a driver")
		}
		plugin, err := h.obs.waitRegistered(ctx, req.Driver)
		if err != nil {
			if refusal := h.obs.refusal(req.Driver); refusal != "" {
				err = fmt.Errorf("%w; the kubelet last refused it: %s", err, refusal)
			}
			return nil, fmt.Errorf("DRA driver %s did not register with the kubelet: %w", req.Driver, err)
		}
		return map[string]any{"plugin": plugin}, nil
	case "wait_unregistered":
		if req.Driver == "" {
			return nil, fmt.Errorf("wait_unregistered needs a driver")
		}
		if err := h.obs.waitUnregistered(ctx, req.Driver); err != nil {
			return nil, fmt.Errorf("DRA driver %s is still registered with the kubelet: %w", req.Driver, err)
		}
		return nil, nil
	case "wait_slice_wipe":
		if err := h.obs.waitSliceWipe(ctx, req.Driver); err != nil {
			return nil, fmt.Errorf("the kubelet did not delete the ResourceSlices of node %s for driver %q (\"\" = all; does the Node exist?): %w", h.nodeName, req.Driver, err)
		}
		return nil, nil
	case "wait_refused":
		if req.Driver == "" {
			return nil, fmt.Errorf("wait_refused needs a driver")
		}
		refusal, err := h.obs.waitRefused(ctx, req.Driver)
		if err != nil {
			return nil, fmt.Errorf("the kubelet did not refuse DRA driver %s: %w", req.Driver, err)
		}
		return map[string]any{"refusal": refusal}, nil
	case "slice_wipes":
		return map[string]any{"wipes": h.obs.sliceWipes()}, nil
	case "bench_prepare":
		return h.benchPrepare(ctx, req)
	default:
		return nil, fmt.Errorf("unknown op %q", req.Op)
	}
}

// prepare does what the kubelet does before it starts a pod's containers:
// PrepareResources for the pod, then GetResources for each container to
// learn the CDI devices it passes to the container runtime.
func (h *harness) prepare(ctx context.Context, req request) (map[string]any, error) {
	if req.Namespace == "" || req.Pod == "" {
		return nil, fmt.Errorf("prepare needs namespace and pod")
	}
	pod, err := h.getPod(ctx, req.Namespace, req.Pod)
	if err != nil {
		return nil, err
	}
	// Like a kubelet, the pod is active from the moment it was admitted,
	// before its resources are prepared.
	h.mu.Lock()
	h.active[podKey(req.Namespace, req.Pod)] = pod
	h.mu.Unlock()

	if err := h.manager.PrepareResources(ctx, pod); err != nil {
		return nil, err
	}
	containers := map[string][]string{}
	for _, list := range [][]v1.Container{pod.Spec.InitContainers, pod.Spec.Containers} {
		for i := range list {
			info, err := h.manager.GetResources(pod, &list[i])
			if err != nil {
				return nil, fmt.Errorf("get resources of container %s: %w", list[i].Name, err)
			}
			ids := make([]string, 0, len(info.CDIDevices))
			for _, device := range info.CDIDevices {
				ids = append(ids, device.Name)
			}
			containers[list[i].Name] = ids
		}
	}
	return map[string]any{"pod_uid": string(pod.UID), "containers": containers}, nil
}

// unprepare does what the kubelet does after a pod's containers have
// stopped. The pod may already be gone from the API server; then the copy
// remembered from prepare stands in, as the kubelet's pod cache does.
func (h *harness) unprepare(ctx context.Context, req request) error {
	if req.Namespace == "" || req.Pod == "" {
		return fmt.Errorf("unprepare needs namespace and pod")
	}
	key := podKey(req.Namespace, req.Pod)
	pod, err := h.getPod(ctx, req.Namespace, req.Pod)
	if apierrors.IsNotFound(err) {
		h.mu.Lock()
		pod = h.active[key]
		h.mu.Unlock()
		if pod == nil {
			return fmt.Errorf("pod %s/%s does not exist and was not prepared by this kubelet", req.Namespace, req.Pod)
		}
	} else if err != nil {
		return err
	}
	if err := h.manager.UnprepareResources(ctx, pod); err != nil {
		return err
	}
	h.mu.Lock()
	delete(h.active, key)
	h.mu.Unlock()
	return nil
}

// getPod reads a pod bound to our node the way a kubelet sees its pods:
// through a list restricted to spec.nodeName, which the Node authorizer
// allows without waiting for its graph to learn about the binding.
func (h *harness) getPod(ctx context.Context, namespace, name string) (*v1.Pod, error) {
	selector := fields.AndSelectors(
		fields.OneTermEqualSelector("spec.nodeName", h.nodeName),
		fields.OneTermEqualSelector("metadata.name", name),
	)
	pods, err := h.client.CoreV1().Pods(namespace).List(ctx, metav1.ListOptions{FieldSelector: selector.String()})
	if err != nil {
		return nil, fmt.Errorf("get pod %s/%s: %w", namespace, name, err)
	}
	if len(pods.Items) == 0 {
		return nil, apierrors.NewNotFound(v1.Resource("pods"), fmt.Sprintf("%s/%s on node %s", namespace, name, h.nodeName))
	}
	return &pods.Items[0], nil
}

func podKey(namespace, name string) string {
	return namespace + "/" + name
}
