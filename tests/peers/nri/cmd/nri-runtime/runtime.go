package main

// The runtime: what containerd's CRI plugin does around pkg/adaptation, step for step
// (internal/nri/nri.go, internal/nri/domain.go, internal/cri/nri/nri_api_linux.go and the
// CRI server's container and sandbox calls, v2.1 to v2.4): which events it relays when,
// under which lock, what it does with each answer, and what it ignores.

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/containerd/nri/pkg/adaptation"
	"github.com/containerd/nri/pkg/api"
	nrilog "github.com/containerd/nri/pkg/log"
	nrigen "github.com/containerd/nri/pkg/runtime-tools/generate"
	"github.com/containerd/ttrpc"
	rspec "github.com/opencontainers/runtime-spec/specs-go"
	rgen "github.com/opencontainers/runtime-tools/generate"

	"nodedra.test/nri/internal/cpuset"
)

// nriState is containerd's per-object bookkeeping (internal/nri/nri.go State): it decides
// whether a stop or remove event is still due, so that each is relayed once.
type nriObjState int

const (
	objCreated nriObjState = iota + 1
	objRunning
	objStopped
	objRemoved
)

type config struct {
	socket              string
	pluginPath          string
	registrationTimeout time.Duration
	requestTimeout      time.Duration
	runtimeName         string
	runtimeVersion      string
	onlineCPUs          string
	onlineMems          string
	debug               bool
}

type harness struct {
	cfg   config
	model *model
	obs   *observer

	// life is held shared by every operation and exclusively by a restart, so that a
	// restart happens between operations, as a containerd restart happens between CRI calls.
	life sync.RWMutex
	nri  *adaptation.Adaptation

	// nriMu is containerd's NRI lock (local.Lock in internal/nri/nri.go): held while an
	// event is relayed and its answer applied, while a plugin is synchronized, and while
	// a plugin's unsolicited updates are applied. It guards state.
	nriMu sync.Mutex
	state map[string]nriObjState

	starting atomic.Bool
}

func newHarness(cfg config) (*harness, error) {
	cpus, err := cpuset.Parse(cfg.onlineCPUs)
	if err != nil {
		return nil, fmt.Errorf("--online-cpus: %w", err)
	}
	mems, err := cpuset.Parse(cfg.onlineMems)
	if err != nil {
		return nil, fmt.Errorf("--online-mems: %w", err)
	}
	if cfg.onlineCPUs == "" {
		cpus = nil
	}
	if cfg.onlineMems == "" {
		mems = nil
	}
	h := &harness{
		cfg:   cfg,
		model: newModel(cpus, mems),
		obs:   newObserver(cfg.debug),
		state: map[string]nriObjState{},
	}
	nrilog.Set(h.obs)
	adaptation.SetPluginRegistrationTimeout(cfg.registrationTimeout)
	adaptation.SetPluginRequestTimeout(cfg.requestTimeout)
	return h, nil
}

// startAdaptation creates and starts the adaptation as containerd's NRI plugin does at
// start-up. The caller holds life exclusively (or nothing else runs yet).
func (h *harness) startAdaptation() error {
	opts := []adaptation.Option{
		adaptation.WithSocketPath(h.cfg.socket),
		adaptation.WithPluginPath(h.cfg.pluginPath),
		adaptation.WithPluginConfigPath(h.cfg.pluginPath),
		adaptation.WithTTRPCOptions(
			[]ttrpc.ClientOpts{ttrpc.WithUnaryClientInterceptor(h.obs.clientInterceptor)},
			[]ttrpc.ServerOpt{ttrpc.WithUnaryServerInterceptor(h.obs.serverInterceptor)},
		),
	}
	r, err := adaptation.New(h.cfg.runtimeName, h.cfg.runtimeVersion, h.syncPlugin, h.updateFromPlugin, opts...)
	if err != nil {
		return err
	}
	h.obs.mu.Lock()
	h.obs.generation++
	h.obs.mu.Unlock()
	// Start synchronizes the pre-installed plugins (there are none) through syncPlugin;
	// that is no plugin's sync, so it is not recorded.
	h.starting.Store(true)
	err = r.Start()
	h.starting.Store(false)
	if err != nil {
		return fmt.Errorf("failed to start NRI interface: %w", err)
	}
	h.nri = r
	logf("NRI %s listening on %s (generation %d)", nriVersion(), h.cfg.socket, h.generation())
	return nil
}

func (h *harness) generation() int {
	h.obs.mu.Lock()
	defer h.obs.mu.Unlock()
	return h.obs.generation
}

// restart is what a containerd restart looks like to plugins: the process dies (every
// plugin connection closes, the socket goes away), and a new one starts, with its NRI
// bookkeeping empty, listening on the same socket. The model is kept (containerd reloads
// its stores from disk).
func (h *harness) restart(down time.Duration) error {
	h.life.Lock()
	defer h.life.Unlock()
	closePluginConnections(h.cfg.socket)
	h.nri.Stop()
	// A plugin may have reconnected between the two steps above.
	closePluginConnections(h.cfg.socket)
	_ = os.Remove(h.cfg.socket)
	h.nriMu.Lock()
	h.state = map[string]nriObjState{}
	h.nriMu.Unlock()
	logf("NRI stopped; restarting in %s", down)
	time.Sleep(down)
	return h.startAdaptation()
}

// closePluginConnections shuts down every accepted connection on the NRI socket, as the
// death of the process would. pkg/adaptation does not close external plugins' connections
// in Stop (it only kills plugins it launched), and it does not expose them either: they
// are found as this process's sockets bound to the socket path. shutdown(2), unlike
// close(2), leaves the descriptor to the Go runtime, which closes it once its reader sees
// the end of the stream.
func closePluginConnections(path string) {
	entries, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		logf("cannot list file descriptors: %v", err)
		return
	}
	closed := 0
	for _, e := range entries {
		fd, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		sa, err := syscall.Getsockname(fd)
		if err != nil {
			continue
		}
		if unix, ok := sa.(*syscall.SockaddrUnix); !ok || unix.Name != path {
			continue
		}
		if listening, err := syscall.GetsockoptInt(fd, syscall.SOL_SOCKET, syscall.SO_ACCEPTCONN); err == nil && listening != 0 {
			continue
		}
		if syscall.Shutdown(fd, syscall.SHUT_RDWR) == nil {
			closed++
		}
	}
	logf("closed %d plugin connection(s)", closed)
}

// -- containerd's bookkeeping (internal/nri/nri.go) ----------------------------------------

// The callers of the following hold nriMu.

func (h *harness) setState(id string, s nriObjState) {
	if s == objRemoved {
		delete(h.state, id)
		return
	}
	h.state[id] = s
}

func (h *harness) needsStopping(id string) bool {
	s := h.state[id]
	return s == objCreated || s == objRunning
}

func (h *harness) needsRemoval(id string) bool {
	s := h.state[id]
	return s == objCreated || s == objRunning || s == objStopped
}

// syncPlugin is containerd's syncPlugin: under the NRI lock, offer every pod and every
// container that has not exited, then apply the plugin's updates (failures only logged).
func (h *harness) syncPlugin(ctx context.Context, cb adaptation.SyncCB) error {
	h.nriMu.Lock()
	defer h.nriMu.Unlock()

	h.model.mu.Lock()
	pods, ctrs := h.model.snapshot()
	h.model.mu.Unlock()
	for _, c := range ctrs {
		switch c.GetState() {
		case api.ContainerState_CONTAINER_CREATED:
			h.setState(c.GetId(), objCreated)
		case api.ContainerState_CONTAINER_RUNNING, api.ContainerState_CONTAINER_PAUSED:
			h.setState(c.GetId(), objRunning)
		case api.ContainerState_CONTAINER_STOPPED:
			h.setState(c.GetId(), objStopped)
		default:
			h.setState(c.GetId(), objRemoved)
		}
	}
	var rec *syncRecord
	if !h.starting.Load() {
		rec = h.obs.beginSync(len(pods), len(ctrs))
	}
	start := time.Now()
	updates, err := cb(ctx, pods, ctrs)
	elapsed := time.Since(start)
	if err != nil {
		if rec != nil {
			h.obs.endSync(rec, elapsed, 0, nil, err)
		}
		return err
	}
	_, outcomes, err := h.model.applyUpdates(updates)
	if err != nil {
		logf("post-sync update failed: %v", err)
	}
	if rec != nil {
		h.obs.endSync(rec, elapsed, len(updates), outcomes, nil)
		logf("synchronized plugin %s: %d pods, %d containers, %d updates in %s", rec.Plugin, len(pods), len(ctrs), len(updates), elapsed)
	}
	return nil
}

// updateFromPlugin is containerd's updateFromPlugin: a plugin's unsolicited
// UpdateContainers, applied under the NRI lock.
func (h *harness) updateFromPlugin(ctx context.Context, updates []*api.ContainerUpdate) ([]*api.ContainerUpdate, error) {
	h.nriMu.Lock()
	defer h.nriMu.Unlock()
	failed, outcomes, err := h.model.applyUpdates(updates)
	rec := &unsolicitedRecord{At: time.Now().UnixNano(), Updates: len(updates), Outcomes: outcomes, Failed: []string{}}
	for _, u := range failed {
		rec.Failed = append(rec.Failed, u.ContainerId)
	}
	if err != nil {
		rec.Error = err.Error()
	}
	h.obs.recordUnsolicited(rec)
	logf("unsolicited update of %d containers, %d failed", len(updates), len(failed))
	return failed, err
}

// evict is containerd's evictContainers: stop each named container (unknown ones are
// skipped, a container that is not running has no task to kill); the stop event follows
// from the exit, asynchronously, once the NRI lock is free. The caller holds nriMu.
func (h *harness) evict(ctx context.Context, evictions []*api.ContainerEviction) []map[string]string {
	out := []map[string]string{}
	for _, e := range evictions {
		h.model.mu.Lock()
		c, ok := h.model.containers[e.ContainerId]
		running := ok && c.state == stateRunning
		if ok {
			c.evicted = orDefault(e.Reason, "evicted")
		}
		if running {
			h.model.stop(c, 137)
		}
		h.model.mu.Unlock()
		out = append(out, map[string]string{"container_id": e.ContainerId, "reason": e.Reason})
		if running {
			go h.notifyExit(context.WithoutCancel(ctx), e.ContainerId)
		}
	}
	return out
}

// notifyExit is containerd's NotifyContainerExit: the exit of a container's task relays
// its stop event, from the event monitor, when the NRI lock is free.
func (h *harness) notifyExit(ctx context.Context, id string) {
	h.life.RLock()
	defer h.life.RUnlock()
	h.model.mu.Lock()
	c, ok := h.model.containers[id]
	if !ok {
		h.model.mu.Unlock()
		return
	}
	pod := h.podNRI(c.podID)
	ctr := c.toNRI(api.ContainerState_CONTAINER_STOPPED)
	h.model.mu.Unlock()
	h.nriMu.Lock()
	defer h.nriMu.Unlock()
	if _, err := h.stopContainer(ctx, pod, ctr); err != nil {
		logf("NRI stop of exited container %s failed: %v", id, err)
	}
}

// stopContainer is containerd's local.stopContainer: relay StopContainer once, then
// apply the updates plugins return for other containers (failures only logged). The
// caller holds nriMu.
func (h *harness) stopContainer(ctx context.Context, pod *api.PodSandbox, ctr *api.Container) ([]updateOutcome, error) {
	if !h.needsStopping(ctr.Id) {
		return []updateOutcome{}, nil
	}
	rpl, err := h.nri.StopContainer(ctx, &api.StopContainerRequest{Pod: pod, Container: ctr})
	h.setState(ctr.Id, objStopped)
	if err != nil {
		return nil, err
	}
	_, outcomes, err := h.model.applyUpdates(rpl.GetUpdate())
	if err != nil {
		logf("post-stop update failed: %v", err)
	}
	return outcomes, nil
}

// removeContainer is containerd's local.RemoveContainer. The caller holds nriMu.
func (h *harness) removeContainer(ctx context.Context, pod *api.PodSandbox, ctr *api.Container) ([]updateOutcome, error) {
	if !h.needsRemoval(ctr.Id) {
		return []updateOutcome{}, nil
	}
	outcomes, err := h.stopContainer(ctx, pod, ctr)
	if err != nil {
		logf("NRI stop before removal of %s failed: %v", ctr.Id, err)
	}
	err = h.nri.RemoveContainer(ctx, &api.RemoveContainerRequest{Pod: pod, Container: ctr})
	h.setState(ctr.Id, objRemoved)
	return outcomes, err
}

// podNRI is the NRI view of a pod, or, as containerd makes it for a container whose
// sandbox is gone, a pod with only its id. The caller holds model.mu.
func (h *harness) podNRI(id string) *api.PodSandbox {
	if p, ok := h.model.pods[id]; ok {
		return p.toNRI()
	}
	return &api.PodSandbox{Id: id}
}

// -- the CRI calls -------------------------------------------------------------------------

var errBadRequest = errors.New("bad request")

// runPod is RunPodSandbox: the sandbox is set up, then NRI is told; a plugin's error fails
// the sandbox, which is then stopped and removed again (with their events).
func (h *harness) runPod(ctx context.Context, s podSpec) (map[string]any, error) {
	h.life.RLock()
	defer h.life.RUnlock()
	defer h.nri.BlockPluginSync().Unblock()

	h.model.mu.Lock()
	if _, ok := h.model.pods[s.ID]; ok {
		h.model.mu.Unlock()
		return nil, fmt.Errorf("%w: pod %s already exists", errBadRequest, s.ID)
	}
	p, err := h.model.newPod(s)
	if err != nil {
		h.model.mu.Unlock()
		return nil, fmt.Errorf("%w: %v", errBadRequest, err)
	}
	h.model.pods[p.id] = p
	h.model.podOrder = append(h.model.podOrder, p.id)
	nriPod := p.toNRI()
	h.model.mu.Unlock()

	start := time.Now()
	h.nriMu.Lock()
	err = h.nri.RunPodSandbox(ctx, &api.RunPodSandboxRequest{Pod: nriPod})
	h.setState(p.id, objRunning)
	h.nriMu.Unlock()
	elapsed := time.Since(start)
	if err != nil {
		h.nriMu.Lock()
		if h.needsStopping(p.id) {
			if err := h.nri.StopPodSandbox(ctx, &api.StopPodSandboxRequest{Pod: nriPod}); err != nil {
				logf("NRI stop of failed pod %s: %v", p.id, err)
			}
			h.setState(p.id, objStopped)
		}
		if h.needsRemoval(p.id) {
			if err := h.nri.RemovePodSandbox(ctx, &api.RemovePodSandboxRequest{Pod: nriPod}); err != nil {
				logf("NRI removal of failed pod %s: %v", p.id, err)
			}
			h.setState(p.id, objRemoved)
		}
		h.nriMu.Unlock()
		h.model.mu.Lock()
		h.model.deletePod(p.id)
		h.model.mu.Unlock()
		return nil, fmt.Errorf("NRI RunPodSandbox failed: %w", err)
	}
	h.model.mu.Lock()
	defer h.model.mu.Unlock()
	return map[string]any{"pod": p.json(h.model), "ns": elapsed.Nanoseconds()}, nil
}

// stopPod is StopPodSandbox: every container of the pod is killed (each stop event comes
// from its exit), then NRI hears of the sandbox stop (once).
func (h *harness) stopPod(ctx context.Context, id string) (map[string]any, error) {
	h.life.RLock()
	defer h.life.RUnlock()
	defer h.nri.BlockPluginSync().Unblock()
	outcomes, err := h.stopPodLocked(ctx, id)
	if err != nil {
		return nil, err
	}
	return map[string]any{"updates": outcomes}, nil
}

func (h *harness) stopPodLocked(ctx context.Context, id string) ([]updateOutcome, error) {
	h.model.mu.Lock()
	p, ok := h.model.pods[id]
	if !ok {
		h.model.mu.Unlock()
		return []updateOutcome{}, nil // StopPodSandbox is idempotent
	}
	// Only running containers have a task to kill, and only their exit relays a stop
	// event; a created container stays created (its stop event comes with its removal).
	var stopping []*api.Container
	for _, c := range h.model.containersOf(id) {
		if c.state == stateRunning {
			h.model.stop(c, 137)
			stopping = append(stopping, c.toNRI(api.ContainerState_CONTAINER_STOPPED))
		}
	}
	nriPod := p.toNRI()
	h.model.mu.Unlock()

	all := []updateOutcome{}
	for _, ctr := range stopping {
		h.nriMu.Lock()
		outcomes, err := h.stopContainer(ctx, nriPod, ctr)
		h.nriMu.Unlock()
		if err != nil {
			logf("NRI stop of container %s failed: %v", ctr.Id, err)
		}
		all = append(all, outcomes...)
	}

	h.nriMu.Lock()
	if h.needsStopping(id) {
		if err := h.nri.StopPodSandbox(ctx, &api.StopPodSandboxRequest{Pod: nriPod}); err != nil {
			logf("NRI sandbox stop notification failed: %v", err)
		}
		h.setState(id, objStopped)
	}
	h.nriMu.Unlock()

	h.model.mu.Lock()
	if p, ok := h.model.pods[id]; ok {
		p.state = podNotReady
	}
	h.model.mu.Unlock()
	return all, nil
}

// removePod is RemovePodSandbox: stop the pod (if not yet), remove each of its containers
// (with their events), then tell NRI the sandbox is gone.
func (h *harness) removePod(ctx context.Context, id string) (map[string]any, error) {
	h.life.RLock()
	defer h.life.RUnlock()
	defer h.nri.BlockPluginSync().Unblock()

	all, err := h.stopPodLocked(ctx, id)
	if err != nil {
		return nil, err
	}
	h.model.mu.Lock()
	p, ok := h.model.pods[id]
	if !ok {
		h.model.mu.Unlock()
		return map[string]any{"updates": all}, nil
	}
	ctrs := h.model.containersOf(id)
	nriPod := p.toNRI()
	h.model.mu.Unlock()
	for _, c := range ctrs {
		outcomes, err := h.removeContainerOp(ctx, c.id, false)
		if err != nil {
			return nil, fmt.Errorf("failed to remove container %q: %w", c.id, err)
		}
		all = append(all, outcomes...)
	}
	h.nriMu.Lock()
	if h.needsRemoval(id) {
		if err := h.nri.RemovePodSandbox(ctx, &api.RemovePodSandboxRequest{Pod: nriPod}); err != nil {
			logf("NRI pod removal notification failed: %v", err)
		}
		h.setState(id, objRemoved)
	}
	h.nriMu.Unlock()
	h.model.mu.Lock()
	h.model.deletePod(id)
	h.model.mu.Unlock()
	return map[string]any{"updates": all}, nil
}

// createResult is what create_container answers.
type createResult struct {
	Container  containerJSON       `json:"container"`
	Adjust     *adjustJSON         `json:"adjust"`
	Updates    []updateOutcome     `json:"updates"`
	Evictions  []map[string]string `json:"evictions"`
	Ns         int64               `json:"ns"`
	Started    bool                `json:"started"`
	StartError string              `json:"start_error,omitempty"`
}

// adjustJSON is a ContainerAdjustment: the resources, env and annotations parts decoded,
// and the whole message as protojson for anything else.
type adjustJSON struct {
	Cpus        string            `json:"cpus"`
	Mems        string            `json:"mems"`
	Resources   *resources        `json:"resources"`
	Env         []map[string]any  `json:"env"`
	Annotations map[string]string `json:"annotations"`
	CDIDevices  []string          `json:"cdi_devices"`
	Raw         any               `json:"raw"`
}

// createContainer is CreateContainer: the spec is built, NRI's CreateContainer is
// relayed (the container not yet in the store, so in state UNKNOWN), evictions and
// updates of other containers are applied (failures ignored), the adjustment is applied
// to the spec through NRI's spec generator, the container is stored, and PostCreate is
// relayed. A plugin's error fails the creation, and NRI then hears of its stop and
// removal.
// With unseen, the container is created as a runtime creates one while it synchronizes a
// plugin that just registered: NRI hears of it neither at its creation nor in the Synchronize
// (containerd#13698, cri-o#10090); its StartContainer is NRI's first word of it.
func (h *harness) createContainer(ctx context.Context, s containerSpec, start, unseen bool) (*createResult, error) {
	h.life.RLock()
	defer h.life.RUnlock()

	h.model.mu.Lock()
	c, err := h.model.newContainer(s)
	if err != nil {
		h.model.mu.Unlock()
		return nil, fmt.Errorf("%w: %v", errBadRequest, err)
	}
	nriPod := h.podNRI(c.podID)
	nriCtr := c.toNRI(api.ContainerState_CONTAINER_UNKNOWN)
	h.model.mu.Unlock()

	block := h.nri.BlockPluginSync()
	defer block.Unblock()

	h.nriMu.Lock()
	began := time.Now()
	rpl, err := &api.CreateContainerResponse{}, error(nil)
	if !unseen {
		rpl, err = h.nri.CreateContainer(ctx, &api.CreateContainerRequest{Pod: nriPod, Container: nriCtr})
	}
	elapsed := time.Since(began)
	h.setState(c.id, objCreated)
	if err != nil {
		h.nriMu.Unlock()
		h.undoCreate(ctx, nriPod, nriCtr)
		return nil, fmt.Errorf("failed to get NRI adjustment for container: %w", err)
	}
	res := &createResult{Ns: elapsed.Nanoseconds()}
	res.Evictions = h.evict(ctx, rpl.GetEvict())
	_, res.Updates, err = h.model.applyUpdates(rpl.GetUpdate())
	if err != nil {
		logf("pre-create update failed: %v", err)
	}
	h.nriMu.Unlock()

	if adjust := rpl.GetAdjust(); adjust != nil {
		res.Adjust = describeAdjust(adjust)
		var injected []string
		gen := rgen.Generator{Config: c.spec}
		ngen := nrigen.SpecGenerator(&gen,
			nrigen.WithCDIDeviceInjector(func(_ *rspec.Spec, devices []string) error {
				injected = append(injected, devices...)
				return nil
			}),
		)
		if err := ngen.Adjust(adjust); err != nil {
			h.undoCreate(ctx, nriPod, nriCtr)
			return nil, fmt.Errorf("failed to NRI-adjust container Spec: %w", err)
		}
		c.spec = gen.Config
		c.injectedCDI = injected
	}

	h.model.mu.Lock()
	if _, ok := h.model.pods[c.podID]; !ok {
		h.model.mu.Unlock()
		h.undoCreate(ctx, nriPod, nriCtr)
		return nil, fmt.Errorf("pod %s went away during the creation of %s", c.podID, c.id)
	}
	h.model.insertContainer(c)
	nriCtr = c.toNRI(api.ContainerState_CONTAINER_CREATED)
	h.model.mu.Unlock()

	h.nriMu.Lock()
	if !unseen {
		if err := h.nri.PostCreateContainer(ctx, &api.PostCreateContainerRequest{Pod: nriPod, Container: nriCtr}); err != nil {
			logf("NRI post-create notification failed: %v", err)
		}
	}
	h.nriMu.Unlock()
	block.Unblock()

	if start {
		if err := h.startContainerLocked(ctx, c.id); err != nil {
			res.StartError = err.Error()
		} else {
			res.Started = true
		}
	}
	h.model.mu.Lock()
	res.Container = c.json(false)
	h.model.mu.Unlock()
	return res, nil
}

// undoCreate is containerd's UndoCreateContainer: a failed creation is a stop and a removal
// as far as NRI goes.
func (h *harness) undoCreate(ctx context.Context, pod *api.PodSandbox, ctr *api.Container) {
	h.nriMu.Lock()
	defer h.nriMu.Unlock()
	if _, err := h.stopContainer(ctx, pod, ctr); err != nil {
		logf("container creation undo (stop) failed: %v", err)
	}
	if _, err := h.removeContainer(ctx, pod, ctr); err != nil {
		logf("container creation undo (remove) failed: %v", err)
	}
}

func describeAdjust(a *api.ContainerAdjustment) *adjustJSON {
	out := &adjustJSON{Annotations: a.GetAnnotations(), Env: []map[string]any{}, CDIDevices: []string{}}
	if r := a.GetLinux().GetResources(); r != nil {
		out.Resources = nriResources(r)
		out.Cpus, out.Mems = out.Resources.Cpus, out.Resources.Mems
	}
	for _, kv := range a.GetEnv() {
		key, remove := api.IsMarkedForRemoval(kv.Key)
		out.Env = append(out.Env, map[string]any{"key": key, "value": kv.Value, "remove": remove})
	}
	for _, d := range a.GetCDIDevices() {
		out.CDIDevices = append(out.CDIDevices, d.Name)
	}
	out.Raw = protoJSON(a)
	return out
}

// startContainer is StartContainer: the task is created (runc refuses CPUs or memory nodes
// that are not online), NRI's StartContainer is relayed (a plugin's error fails the start,
// and NRI then hears of the stop), the task starts, PostStart is relayed.
func (h *harness) startContainer(ctx context.Context, id string) (map[string]any, error) {
	h.life.RLock()
	defer h.life.RUnlock()
	if err := h.startContainerLocked(ctx, id); err != nil {
		return nil, err
	}
	h.model.mu.Lock()
	defer h.model.mu.Unlock()
	return map[string]any{"container": h.model.containers[id].json(false)}, nil
}

// startContainerLocked: the caller holds life shared.
func (h *harness) startContainerLocked(ctx context.Context, id string) error {
	h.model.mu.Lock()
	c, ok := h.model.containers[id]
	if !ok {
		h.model.mu.Unlock()
		return fmt.Errorf("%w: no container %s", errBadRequest, id)
	}
	if c.state != stateCreated {
		h.model.mu.Unlock()
		return fmt.Errorf("container %s is in %s state, not created", id, c.state)
	}
	if err := h.model.checkOnline(c.spec); err != nil {
		h.model.mu.Unlock()
		return fmt.Errorf("failed to create containerd task: runc create failed: %w", err)
	}
	nriPod := h.podNRI(c.podID)
	nriCtr := c.toNRI(api.ContainerState_CONTAINER_CREATED)
	h.model.mu.Unlock()

	defer h.nri.BlockPluginSync().Unblock()
	h.nriMu.Lock()
	err := h.nri.StartContainer(ctx, &api.StartContainerRequest{Pod: nriPod, Container: nriCtr})
	h.setState(id, objRunning)
	h.nriMu.Unlock()
	if err != nil {
		h.model.mu.Lock()
		h.model.stop(c, 128)
		h.model.mu.Unlock()
		h.nriMu.Lock()
		if _, err := h.stopContainer(ctx, nriPod, nriCtr); err != nil {
			logf("NRI stop failed for failed container %s: %v", id, err)
		}
		h.nriMu.Unlock()
		return fmt.Errorf("NRI container start failed: %w", err)
	}

	h.model.mu.Lock()
	h.model.start(c)
	nriCtr = c.toNRI(api.ContainerState_CONTAINER_RUNNING)
	h.model.mu.Unlock()

	h.nriMu.Lock()
	if err := h.nri.PostStartContainer(ctx, &api.PostStartContainerRequest{Pod: nriPod, Container: nriCtr}); err != nil {
		logf("NRI post-start notification failed: %v", err)
	}
	h.nriMu.Unlock()
	return nil
}

// updateContainer is UpdateContainerResources: NRI's UpdateContainer is relayed with the
// kubelet's request; evictions are carried out and updates of other containers applied
// (failures ignored); the last update, the plugins' say on this container, replaces the
// request if there is one; the result is merged into the spec (and the cgroups of a
// running container); PostUpdate is relayed.
func (h *harness) updateContainer(ctx context.Context, id string, requested *resources) (map[string]any, error) {
	h.life.RLock()
	defer h.life.RUnlock()
	defer h.nri.BlockPluginSync().Unblock()

	if requested == nil {
		requested = &resources{}
	}
	if err := checkCPUSets(requested.Cpus, requested.Mems); err != nil {
		return nil, fmt.Errorf("%w: %v", errBadRequest, err)
	}
	h.model.mu.Lock()
	c, ok := h.model.containers[id]
	if !ok {
		h.model.mu.Unlock()
		return nil, fmt.Errorf("%w: no container %s", errBadRequest, id)
	}
	nriPod := h.podNRI(c.podID)
	nriCtr := c.toNRI(nriState(c.state))
	h.model.mu.Unlock()

	h.nriMu.Lock()
	began := time.Now()
	rpl, err := h.nri.UpdateContainer(ctx, &api.UpdateContainerRequest{
		Pod: nriPod, Container: nriCtr, LinuxResources: criToNRI(requested),
	})
	elapsed := time.Since(began)
	if err != nil {
		h.nriMu.Unlock()
		return nil, fmt.Errorf("NRI container update failed: %w", err)
	}
	evictions := h.evict(ctx, rpl.GetEvict())
	updates := rpl.GetUpdate()
	outcomes := []updateOutcome{}
	var final *api.LinuxResources
	if n := len(updates); n > 0 {
		if n > 1 {
			_, outcomes, err = h.model.applyUpdates(updates[:n-1])
			if err != nil {
				logf("pre-update update failed: %v", err)
			}
		}
		final = updates[n-1].GetLinux().GetResources()
	}
	h.nriMu.Unlock()

	applied := requested
	if final != nil {
		applied = nriToCRI(final)
	}
	h.model.mu.Lock()
	err = h.model.updateResources(id, applied)
	if err == errUnknownContainer {
		err = fmt.Errorf("container %s went away", id)
	}
	if err != nil {
		h.model.mu.Unlock()
		return nil, fmt.Errorf("failed to update resources: %w", err)
	}
	c = h.model.containers[id]
	nriCtr = c.toNRI(nriState(c.state))
	cj := c.json(false)
	h.model.mu.Unlock()

	h.nriMu.Lock()
	if err := h.nri.PostUpdateContainer(ctx, &api.PostUpdateContainerRequest{Pod: nriPod, Container: nriCtr}); err != nil {
		logf("NRI post-update notification failed: %v", err)
	}
	h.nriMu.Unlock()
	return map[string]any{
		"requested": requested, "applied": applied, "plugins_changed": final != nil,
		"container": cj, "updates": outcomes, "evictions": evictions, "ns": elapsed.Nanoseconds(),
	}, nil
}

// stopContainerOp is StopContainer: the task is killed, then NRI's StopContainer is
// relayed (once) and the updates plugins return for other containers applied.
func (h *harness) stopContainerOp(ctx context.Context, id string, exitCode int32) (map[string]any, error) {
	h.life.RLock()
	defer h.life.RUnlock()
	defer h.nri.BlockPluginSync().Unblock()

	h.model.mu.Lock()
	c, ok := h.model.containers[id]
	if !ok {
		h.model.mu.Unlock()
		return map[string]any{"updates": []updateOutcome{}}, nil // idempotent, as in CRI
	}
	if c.state != stateStopped {
		h.model.stop(c, exitCode)
	}
	nriPod := h.podNRI(c.podID)
	nriCtr := c.toNRI(api.ContainerState_CONTAINER_STOPPED)
	h.model.mu.Unlock()

	h.nriMu.Lock()
	began := time.Now()
	outcomes, err := h.stopContainer(ctx, nriPod, nriCtr)
	elapsed := time.Since(began)
	h.nriMu.Unlock()
	if err != nil {
		logf("NRI failed to stop container: %v", err)
	}
	h.model.mu.Lock()
	defer h.model.mu.Unlock()
	return map[string]any{"updates": nonNilOutcomes(outcomes), "container": c.json(false), "ns": elapsed.Nanoseconds()}, nil
}

// removeContainerOp is RemoveContainer: a running container is stopped first (with its
// stop event), then NRI's RemoveContainer is relayed and the container deleted.
func (h *harness) removeContainerOp(ctx context.Context, id string, lock bool) ([]updateOutcome, error) {
	if lock {
		h.life.RLock()
		defer h.life.RUnlock()
		defer h.nri.BlockPluginSync().Unblock()
	}
	h.model.mu.Lock()
	c, ok := h.model.containers[id]
	if !ok {
		h.model.mu.Unlock()
		return []updateOutcome{}, nil
	}
	running := c.state == stateRunning
	if running {
		h.model.stop(c, 137)
	}
	nriPod := h.podNRI(c.podID)
	nriCtr := c.toNRI(nriState(c.state))
	h.model.mu.Unlock()

	// A running container is killed first; its exit relays the stop event.
	all := []updateOutcome{}
	if running {
		h.nriMu.Lock()
		outcomes, err := h.stopContainer(ctx, nriPod, nriCtr)
		h.nriMu.Unlock()
		if err != nil {
			logf("NRI failed to stop container %s: %v", id, err)
		}
		all = append(all, outcomes...)
	}
	h.model.mu.Lock()
	c.removing = true
	h.model.mu.Unlock()

	// containerd's RemoveContainer relays a stop first if none was (a created container).

	h.nriMu.Lock()
	outcomes, err := h.removeContainer(ctx, nriPod, nriCtr)
	h.nriMu.Unlock()
	if err != nil {
		logf("NRI failed to remove container %s: %v", id, err)
	}
	all = append(all, outcomes...)
	h.model.mu.Lock()
	h.model.deleteContainer(id)
	h.model.mu.Unlock()
	return all, nil
}

func nonNilOutcomes(o []updateOutcome) []updateOutcome {
	if o == nil {
		return []updateOutcome{}
	}
	return o
}

// add puts pods and containers into the stores without any event, as if they had been
// there before (containerd learnt of them when it created them or from its stores at
// start-up, so its NRI bookkeeping knows them too).
func (h *harness) add(pods []podSpec, ctrs []containerSpec, gen *generateSpec) (int, int, error) {
	h.life.RLock()
	defer h.life.RUnlock()
	if gen != nil {
		p, c, err := gen.expand()
		if err != nil {
			return 0, 0, err
		}
		pods, ctrs = append(pods, p...), append(ctrs, c...)
	}
	h.nriMu.Lock()
	defer h.nriMu.Unlock()
	h.model.mu.Lock()
	defer h.model.mu.Unlock()
	for _, s := range pods {
		if _, ok := h.model.pods[s.ID]; ok {
			return 0, 0, fmt.Errorf("%w: pod %s already exists", errBadRequest, s.ID)
		}
		p, err := h.model.newPod(s)
		if err != nil {
			return 0, 0, fmt.Errorf("%w: %v", errBadRequest, err)
		}
		h.model.pods[p.id] = p
		h.model.podOrder = append(h.model.podOrder, p.id)
		if p.state == podReady {
			h.setState(p.id, objRunning)
		} else {
			h.setState(p.id, objStopped)
		}
	}
	for _, s := range ctrs {
		c, err := h.model.newContainer(s)
		if err != nil {
			return 0, 0, fmt.Errorf("%w: %v", errBadRequest, err)
		}
		switch s.State {
		case "", stateRunning:
			h.model.start(c)
			h.setState(c.id, objRunning)
		case stateCreated:
			h.setState(c.id, objCreated)
		case stateStopped:
			h.model.start(c)
			h.model.stop(c, 0)
			h.setState(c.id, objStopped)
		default:
			return 0, 0, fmt.Errorf("%w: container %s: unknown state %q (created, running, stopped)", errBadRequest, s.ID, s.State)
		}
		h.model.insertContainer(c)
	}
	return len(pods), len(ctrs), nil
}

// generateSpec asks add for many similar pods and containers at once.
type generateSpec struct {
	Prefix          string            `json:"prefix"`
	Pods            int               `json:"pods"`
	Containers      int               `json:"containers"`
	AnnotationBytes int               `json:"annotation_bytes"` // padding per container
	Env             []string          `json:"env"`
	Labels          map[string]string `json:"labels"`
	State           string            `json:"state"`
	Resources       *resources        `json:"resources"`
}

func (g *generateSpec) expand() ([]podSpec, []containerSpec, error) {
	if g.Pods <= 0 {
		g.Pods = 1
	}
	prefix := orDefault(g.Prefix, "bulk")
	pods := make([]podSpec, 0, g.Pods)
	for i := 0; i < g.Pods; i++ {
		id := fmt.Sprintf("%s-pod-%d", prefix, i)
		pods = append(pods, podSpec{ID: id, Name: id, Namespace: prefix, UID: fmt.Sprintf("%s-uid-%d", prefix, i)})
	}
	pad := ""
	if g.AnnotationBytes > 0 {
		b := make([]byte, g.AnnotationBytes)
		for i := range b {
			b[i] = 'a' + byte(i%26)
		}
		pad = string(b)
	}
	ctrs := make([]containerSpec, 0, g.Containers)
	for i := 0; i < g.Containers; i++ {
		s := containerSpec{
			ID:        fmt.Sprintf("%s-ctr-%d", prefix, i),
			Pod:       pods[i%len(pods)].ID,
			Name:      fmt.Sprintf("c%d", i),
			Env:       g.Env,
			Labels:    g.Labels,
			State:     g.State,
			Resources: g.Resources,
		}
		if pad != "" {
			s.Annotations = map[string]string{"nodedra.test/padding": pad}
		}
		ctrs = append(ctrs, s)
	}
	return pods, ctrs, nil
}
