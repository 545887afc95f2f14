package main

// The request protocol: one JSON object per line on stdin, one JSON object per line on
// stdout answering it (with the request's id; requests run concurrently, so answers may
// come out of order). Failures answer {"id":N,"ok":false,"error":"..."}. Every request may
// carry "timeout" (seconds, default 60) bounding what it waits for.
//
// Objects used below:
//
//	pod        {"id":"p1","name":"web","namespace":"ns","uid":"u1","labels":{},"annotations":{},
//	            "runtime_handler":"","state":"ready"|"notready" (add only)}
//	container  {"id":"c1","pod":"p1","name":"app","labels":{},"annotations":{},"env":["K=V"],
//	            "args":[],"cdi_devices":["vendor/class=name"],"resources":RES,
//	            "state":"running"|"created"|"stopped" (add only)}
//	RES        {"cpus":"0-3","mems":"0","shares":N,"quota":N,"period":N,"memory_limit":N,
//	            "memory_swap":N,"pids_limit":N,"unified":{}}   (in requests 0/"" = unset, as in
//	            CRI; in answers absent = not set in the container's spec)
//	CONTAINER  the model's container: {"id","pod","name","state","labels","annotations","env",
//	            "args","cdi_devices","injected_cdi_devices","cpus","mems","resources":RES,
//	            "created_at","started_at","finished_at","exit_code","pid","evicted"[,"spec"]}
//	OUTCOME    an update a plugin asked for and what became of it: {"container_id",
//	            "resources":RES,"ignore_failure","outcome":"applied"|"unknown container"|
//	            "failed: ..."|"ignored failure: ..."}
//
// Operations:
//
//	{"id":1,"op":"ping"}
//	  -> {"nri_version":"v0.12.5","ttrpc_version":"v1.2.9","nri_line":"v0.12",
//	      "containerd":"containerd 2.3/2.4","fills_cdi_devices":true,"sends_pod_updates":true,
//	      "runtime_name":"containerd","runtime_version":"v2.4.2","socket":"...",
//	      "registration_timeout_ms":5000,"request_timeout_ms":2000,"generation":1}
//	{"op":"add","pods":[pod...],"containers":[container...],
//	 "generate":{"prefix":"bulk","pods":10,"containers":1000,"annotation_bytes":5000,
//	             "env":[],"labels":{},"state":"running","resources":RES}}
//	  -> {"pods":N,"containers":N}   (into the stores, no events: they were there before)
//	{"op":"run_pod","pod":pod}                  -> {"pod":{...},"ns":N}
//	{"op":"stop_pod","pod_id":"p1"}             -> {"updates":[OUTCOME...]}
//	{"op":"remove_pod","pod_id":"p1"}           -> {"updates":[OUTCOME...]}
//	{"op":"update_pod","pod_id":"p1","resources":RES,"overhead":RES}   (v0.12 builds only)
//	{"op":"create_container","container":container,"start":false}
//	  -> {"container":CONTAINER,"adjust":{"cpus","mems","resources":RES,"env":[{"key","value",
//	      "remove"}],"annotations":{},"cdi_devices":[],"raw":<protojson>}|null,
//	      "updates":[OUTCOME...],"evictions":[{"container_id","reason"}],"ns":N,
//	      "started":bool,"start_error":"..."}     (ns: the adaptation's CreateContainer call)
//	{"op":"start_container","container_id":"c1"}          -> {"container":CONTAINER}
//	{"op":"update_container","container_id":"c1","resources":RES}
//	  -> {"requested":RES,"applied":RES,"plugins_changed":bool,"container":CONTAINER,
//	      "updates":[OUTCOME...],"evictions":[...],"ns":N}
//	{"op":"stop_container","container_id":"c1","exit_code":0}
//	  -> {"updates":[OUTCOME...],"container":CONTAINER,"ns":N}
//	{"op":"remove_container","container_id":"c1"}         -> {"updates":[OUTCOME...]}
//	{"op":"containers","pod_id":"","with_spec":false}      -> {"containers":[CONTAINER...]}
//	{"op":"container","container_id":"c1","with_spec":true} -> {"container":CONTAINER}
//	{"op":"pods"}                                          -> {"pods":[{...}]}
//	{"op":"syncs"}
//	  -> {"syncs":[{"plugin","generation","at","pods","containers","ns","updates",
//	      "outcomes":[OUTCOME...],"chunks":[{"pods","containers","more","bytes","ns",
//	      "updates","error"}],"error","done"}]}
//	{"op":"wait_sync","count":N}        -> {"syncs":[...]}  (once N syncs are done)
//	{"op":"unsolicited"}
//	  -> {"count":N,"calls":[{"at","updates","outcomes":[OUTCOME...],"failed":["c1"],"error"}]}
//	{"op":"wait_unsolicited","count":N} -> as unsolicited, once N calls were answered
//	{"op":"events","since":0}
//	  -> {"events":[{"seq","at","method","event","pod","container","ns","error"}],"seen":N}
//	      (every request the adaptation sent to a plugin other than Synchronize and
//	      Configure; method is the ttrpc method, e.g. StateChange, event the NRI event)
//	{"op":"plugins"}
//	  -> {"plugins":[{"name":"10-stub","index","base","generation","registered_at",
//	      "events","synchronized","synced_at","closed","closed_at","dropped"}],
//	      "refused":[{"at","plugin","error"}],"generation":N}   (refused: connections the
//	      adaptation gave up on before synchronizing: bad name or index, registration
//	      timeout, Configure failed or subscribed to events the runtime does not know)
//	{"op":"wait_plugin","name":"10-stub"}        -> {"plugin":{...}}  (connected and
//	      synchronized to the adaptation as started now)
//	{"op":"wait_plugin_closed","name":"10-stub"} -> {"plugin":{...}}
//	{"op":"wait_refused","count":N}              -> {"refused":[...]}  (N refusals so far)
//	{"op":"fail_updates","container_ids":["c1"],"error":"..."}  -> {}  (updates of those
//	      containers fail from now on, as a runc error would; "error":"" heals them)
//	{"op":"restart","down":0.5}  -> {"generation":N}  (a containerd restart: connections
//	      closed, socket gone for "down" seconds, a new adaptation on the same socket)
//	{"op":"stop"}                -> {} then exit

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"runtime/debug"
	"time"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
)

const defaultTimeout = 60 * time.Second

type request struct {
	ID           *int64          `json:"id"`
	Op           string          `json:"op"`
	Timeout      float64         `json:"timeout"`
	Pods         []podSpec       `json:"pods"`
	Containers   []containerSpec `json:"containers"`
	Generate     *generateSpec   `json:"generate"`
	Pod          *podSpec        `json:"pod"`
	Container    *containerSpec  `json:"container"`
	PodID        string          `json:"pod_id"`
	ContainerID  string          `json:"container_id"`
	ContainerIDs []string        `json:"container_ids"`
	Resources    *resources      `json:"resources"`
	Overhead     *resources      `json:"overhead"`
	Start        bool            `json:"start"`
	Unseen       bool            `json:"unseen"`
	ExitCode     int32           `json:"exit_code"`
	WithSpec     bool            `json:"with_spec"`
	Count        int             `json:"count"`
	Since        int             `json:"since"`
	Name         string          `json:"name"`
	Error        string          `json:"error"`
	Down         float64         `json:"down"`
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
		if errors.Is(err, context.DeadlineExceeded) && ctx.Err() != nil {
			err = fmt.Errorf("%s: nothing happened within %s: %w", req.Op, req.timeout(), err)
		}
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
		return h.ping(), nil
	case "add":
		pods, ctrs, err := h.add(req.Pods, req.Containers, req.Generate)
		if err != nil {
			return nil, err
		}
		return map[string]any{"pods": pods, "containers": ctrs}, nil
	case "run_pod":
		if req.Pod == nil {
			return nil, fmt.Errorf("%w: run_pod needs a pod", errBadRequest)
		}
		return h.runPod(ctx, *req.Pod)
	case "stop_pod":
		return h.stopPod(ctx, req.PodID)
	case "remove_pod":
		return h.removePod(ctx, req.PodID)
	case "update_pod":
		return h.updatePod(ctx, req.PodID, req.Overhead, req.Resources)
	case "create_container":
		if req.Container == nil {
			return nil, fmt.Errorf("%w: create_container needs a container", errBadRequest)
		}
		res, err := h.createContainer(ctx, *req.Container, req.Start, req.Unseen)
		if err != nil {
			return nil, err
		}
		return toMap(res)
	case "start_container":
		return h.startContainer(ctx, req.ContainerID)
	case "update_container":
		return h.updateContainer(ctx, req.ContainerID, req.Resources)
	case "stop_container":
		return h.stopContainerOp(ctx, req.ContainerID, req.ExitCode)
	case "remove_container":
		outcomes, err := h.removeContainerOp(ctx, req.ContainerID, true)
		if err != nil {
			return nil, err
		}
		return map[string]any{"updates": outcomes}, nil
	case "containers":
		h.model.mu.Lock()
		defer h.model.mu.Unlock()
		out := []containerJSON{}
		for _, id := range h.model.ctrOrder {
			if c := h.model.containers[id]; req.PodID == "" || c.podID == req.PodID {
				out = append(out, c.json(req.WithSpec))
			}
		}
		return map[string]any{"containers": out}, nil
	case "container":
		h.model.mu.Lock()
		defer h.model.mu.Unlock()
		c, ok := h.model.containers[req.ContainerID]
		if !ok {
			return nil, fmt.Errorf("%w: no container %s", errBadRequest, req.ContainerID)
		}
		return map[string]any{"container": c.json(req.WithSpec)}, nil
	case "pods":
		h.model.mu.Lock()
		defer h.model.mu.Unlock()
		out := []podJSON{}
		for _, id := range h.model.podOrder {
			out = append(out, h.model.pods[id].json(h.model))
		}
		return map[string]any{"pods": out}, nil
	case "syncs":
		return h.syncs(), nil
	case "wait_sync":
		err := h.obs.wait(ctx, func() bool { return doneSyncs(h.obs.syncs) >= req.Count })
		if err != nil {
			return nil, fmt.Errorf("waiting for %d completed syncs (have %d): %w", req.Count, h.doneSyncCount(), err)
		}
		return h.syncs(), nil
	case "unsolicited":
		return h.unsolicited(), nil
	case "wait_unsolicited":
		err := h.obs.wait(ctx, func() bool { return len(h.obs.unsolicited) >= req.Count })
		if err != nil {
			return nil, fmt.Errorf("waiting for %d unsolicited UpdateContainers calls: %w", req.Count, err)
		}
		return h.unsolicited(), nil
	case "events":
		h.obs.mu.Lock()
		defer h.obs.mu.Unlock()
		out := []eventRecord{}
		for _, e := range h.obs.events {
			if e.Seq > req.Since {
				out = append(out, e)
			}
		}
		return map[string]any{"events": out, "seen": h.obs.eventsSeen}, nil
	case "plugins":
		h.obs.mu.Lock()
		defer h.obs.mu.Unlock()
		out := []pluginRecord{}
		for _, p := range h.obs.plugins {
			out = append(out, *p)
		}
		refused := append([]refusal{}, h.obs.refusals...)
		return map[string]any{"plugins": out, "refused": refused, "generation": h.obs.generation}, nil
	case "wait_refused":
		err := h.obs.wait(ctx, func() bool { return len(h.obs.refusals) >= req.Count })
		if err != nil {
			return nil, fmt.Errorf("waiting for %d refused plugin connections: %w", req.Count, err)
		}
		h.obs.mu.Lock()
		defer h.obs.mu.Unlock()
		return map[string]any{"refused": append([]refusal{}, h.obs.refusals...)}, nil
	case "wait_plugin", "wait_plugin_closed":
		return h.waitPlugin(ctx, req.Name, req.Op == "wait_plugin_closed")
	case "fail_updates":
		h.model.mu.Lock()
		defer h.model.mu.Unlock()
		for _, id := range req.ContainerIDs {
			if req.Error == "" {
				delete(h.model.failing, id)
			} else {
				h.model.failing[id] = req.Error
			}
		}
		return nil, nil
	case "restart":
		if err := h.restart(time.Duration(req.Down * float64(time.Second))); err != nil {
			return nil, err
		}
		return map[string]any{"generation": h.generation()}, nil
	default:
		return nil, fmt.Errorf("%w: unknown op %q", errBadRequest, req.Op)
	}
}

func (h *harness) ping() map[string]any {
	return map[string]any{
		"nri_version":             nriVersion(),
		"ttrpc_version":           moduleVersion("github.com/containerd/ttrpc"),
		"nri_line":                nriLine,
		"containerd":              containerdLine,
		"fills_cdi_devices":       fillsCDIDevices,
		"sends_pod_updates":       sendsPodUpdates,
		"runtime_name":            h.cfg.runtimeName,
		"runtime_version":         h.cfg.runtimeVersion,
		"socket":                  h.cfg.socket,
		"registration_timeout_ms": h.cfg.registrationTimeout.Milliseconds(),
		"request_timeout_ms":      h.cfg.requestTimeout.Milliseconds(),
		"generation":              h.generation(),
	}
}

func (h *harness) syncs() map[string]any {
	h.obs.mu.Lock()
	defer h.obs.mu.Unlock()
	out := make([]syncRecord, 0, len(h.obs.syncs))
	for _, s := range h.obs.syncs {
		out = append(out, *s)
	}
	return map[string]any{"syncs": out}
}

func (h *harness) doneSyncCount() int {
	h.obs.mu.Lock()
	defer h.obs.mu.Unlock()
	return doneSyncs(h.obs.syncs)
}

func doneSyncs(syncs []*syncRecord) int {
	n := 0
	for _, s := range syncs {
		if s.Done {
			n++
		}
	}
	return n
}

func (h *harness) unsolicited() map[string]any {
	h.obs.mu.Lock()
	defer h.obs.mu.Unlock()
	out := make([]unsolicitedRecord, 0, len(h.obs.unsolicited))
	for _, u := range h.obs.unsolicited {
		out = append(out, *u)
	}
	return map[string]any{"count": len(out), "calls": out}
}

func (h *harness) waitPlugin(ctx context.Context, name string, closed bool) (map[string]any, error) {
	if name == "" {
		return nil, fmt.Errorf("%w: name the plugin (\"<idx>-<name>\")", errBadRequest)
	}
	var found pluginRecord
	err := h.obs.wait(ctx, func() bool {
		p := h.obs.plugin(name)
		if p == nil {
			return false
		}
		found = *p
		if closed {
			return p.Closed
		}
		return p.Generation == h.obs.generation && p.Synchronized && !p.Closed
	})
	if err != nil {
		h.obs.mu.Lock()
		defer h.obs.mu.Unlock()
		state := "never registered"
		if p := h.obs.plugin(name); p != nil {
			state = fmt.Sprintf("last seen %+v (runtime generation %d)", *p, h.obs.generation)
		}
		if n := len(h.obs.refusals); n > 0 {
			state += fmt.Sprintf("; last refused connection: %+v", h.obs.refusals[n-1])
		}
		if closed {
			return nil, fmt.Errorf("plugin %s did not disconnect (%s): %w", name, state, err)
		}
		return nil, fmt.Errorf("plugin %s did not connect and synchronize (%s): %w", name, state, err)
	}
	return map[string]any{"plugin": found}, nil
}

// -- helpers -------------------------------------------------------------------------------

func toMap(v any) (map[string]any, error) {
	data, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	var out map[string]any
	err = json.Unmarshal(data, &out)
	return out, err
}

func protoJSON(m proto.Message) json.RawMessage {
	data, err := protojson.MarshalOptions{UseProtoNames: true}.Marshal(m)
	if err != nil {
		return json.RawMessage(`null`)
	}
	return data
}

// moduleVersion is the version of a module this binary was built with.
func moduleVersion(path string) string {
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return "unknown"
	}
	for _, dep := range info.Deps {
		if dep.Path == path {
			if dep.Replace != nil {
				return dep.Replace.Version
			}
			return dep.Version
		}
	}
	return "unknown"
}

func nriVersion() string { return moduleVersion("github.com/containerd/nri") }
