package main

// The model: what containerd's CRI plugin keeps in its sandbox and container stores, cut
// down to what NRI sees and changes. Each container carries an OCI runtime spec, as in
// containerd, so that adjustments go through NRI's own spec generator exactly as containerd
// applies them, and updates are merged into the spec the way containerd merges an
// UpdateContainerResources request.

import (
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/containerd/nri/pkg/api"
	rspec "github.com/opencontainers/runtime-spec/specs-go"
	"nodedra.test/nri/internal/cpuset"
)

const (
	stateCreated = "created"
	stateRunning = "running"
	stateStopped = "stopped"

	podReady    = "ready"
	podNotReady = "notready"

	defaultPath = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
)

type pod struct {
	id             string
	name           string
	namespace      string
	uid            string
	labels         map[string]string
	annotations    map[string]string
	runtimeHandler string
	cgroupParent   string
	state          string
	createdAt      int64
}

type container struct {
	id          string
	podID       string
	name        string
	state       string
	labels      map[string]string
	annotations map[string]string // the CRI config's own; the spec has containerd's
	cdiDevices  []string          // CRI ContainerConfig.CDIDevices, as the kubelet sends them
	injectedCDI []string          // CDI devices plugins asked to inject (in the spec only)
	spec        *rspec.Spec
	createdAt   int64
	startedAt   int64
	finishedAt  int64
	exitCode    int32
	pid         uint32
	removing    bool
	evicted     string
}

// model is the runtime's store of pods and containers. Its mutex guards the maps and
// every object in them; it is never held while a plugin is called.
type model struct {
	mu         sync.Mutex
	pods       map[string]*pod
	podOrder   []string
	containers map[string]*container
	ctrOrder   []string
	onlineCPUs cpuset.Set // nil: every CPU is online
	onlineMems cpuset.Set
	failing    map[string]string // container ID -> error its updates fail with (injected)
	nextPid    uint32
}

func newModel(onlineCPUs, onlineMems cpuset.Set) *model {
	return &model{
		pods:       map[string]*pod{},
		containers: map[string]*container{},
		onlineCPUs: onlineCPUs,
		onlineMems: onlineMems,
		failing:    map[string]string{},
		nextPid:    1000,
	}
}

// -- JSON forms ------------------------------------------------------------------------

// podSpec is a pod as a test describes it (run_pod, add).
type podSpec struct {
	ID             string            `json:"id"`
	Name           string            `json:"name"`
	Namespace      string            `json:"namespace"`
	UID            string            `json:"uid"`
	Labels         map[string]string `json:"labels"`
	Annotations    map[string]string `json:"annotations"`
	RuntimeHandler string            `json:"runtime_handler"`
	State          string            `json:"state"` // add only: ready (default) or notready
}

// containerSpec is a container as a test describes it: what the kubelet's
// CreateContainer request would carry (create_container, add).
type containerSpec struct {
	ID          string            `json:"id"`
	Pod         string            `json:"pod"`
	Name        string            `json:"name"`
	Labels      map[string]string `json:"labels"`
	Annotations map[string]string `json:"annotations"`
	Env         []string          `json:"env"`
	Args        []string          `json:"args"`
	CDIDevices  []string          `json:"cdi_devices"`
	Resources   *resources        `json:"resources"`
	State       string            `json:"state"` // add only: running (default), created or stopped
}

// resources is the JSON form of a container's Linux resources, the part a CPU and memory
// plugin deals with. In requests zero means "not set", as in CRI; in answers an absent
// field is not set in the container's spec.
type resources struct {
	Cpus        string            `json:"cpus"`
	Mems        string            `json:"mems"`
	Shares      *uint64           `json:"shares,omitempty"`
	Quota       *int64            `json:"quota,omitempty"`
	Period      *uint64           `json:"period,omitempty"`
	MemoryLimit *int64            `json:"memory_limit,omitempty"`
	MemorySwap  *int64            `json:"memory_swap,omitempty"`
	PidsLimit   *int64            `json:"pids_limit,omitempty"`
	Unified     map[string]string `json:"unified,omitempty"`
}

type containerJSON struct {
	ID                 string            `json:"id"`
	Pod                string            `json:"pod"`
	Name               string            `json:"name"`
	State              string            `json:"state"`
	Labels             map[string]string `json:"labels"`
	Annotations        map[string]string `json:"annotations"`
	Env                []string          `json:"env"`
	Args               []string          `json:"args"`
	CDIDevices         []string          `json:"cdi_devices"`
	InjectedCDIDevices []string          `json:"injected_cdi_devices"`
	Cpus               string            `json:"cpus"`
	Mems               string            `json:"mems"`
	Resources          resources         `json:"resources"`
	CreatedAt          int64             `json:"created_at"`
	StartedAt          int64             `json:"started_at"`
	FinishedAt         int64             `json:"finished_at"`
	ExitCode           int32             `json:"exit_code"`
	Pid                uint32            `json:"pid"`
	Evicted            string            `json:"evicted,omitempty"`
	Spec               *rspec.Spec       `json:"spec,omitempty"`
}

type podJSON struct {
	ID          string            `json:"id"`
	Name        string            `json:"name"`
	Namespace   string            `json:"namespace"`
	UID         string            `json:"uid"`
	State       string            `json:"state"`
	Labels      map[string]string `json:"labels"`
	Annotations map[string]string `json:"annotations"`
	Containers  []string          `json:"containers"`
}

// -- building pods and containers ------------------------------------------------------

func (m *model) newPod(s podSpec) (*pod, error) {
	if s.ID == "" {
		return nil, fmt.Errorf("a pod needs an id")
	}
	p := &pod{
		id:             s.ID,
		name:           orDefault(s.Name, s.ID),
		namespace:      orDefault(s.Namespace, "default"),
		uid:            orDefault(s.UID, "uid-"+s.ID),
		runtimeHandler: s.RuntimeHandler,
		state:          podReady,
		createdAt:      time.Now().UnixNano(),
	}
	switch s.State {
	case "", podReady:
	case podNotReady:
		p.state = podNotReady
	default:
		return nil, fmt.Errorf("pod %s: unknown state %q (ready, notready)", s.ID, s.State)
	}
	p.cgroupParent = "/kubepods/pod" + p.uid
	// The kubelet's labels, then containerd's, then the test's own.
	p.labels = map[string]string{
		"io.kubernetes.pod.name":      p.name,
		"io.kubernetes.pod.namespace": p.namespace,
		"io.kubernetes.pod.uid":       p.uid,
		"io.cri-containerd.kind":      "sandbox",
	}
	maps.Copy(p.labels, s.Labels)
	p.annotations = map[string]string{
		"io.kubernetes.cri.container-type":    "sandbox",
		"io.kubernetes.cri.sandbox-id":        p.id,
		"io.kubernetes.cri.sandbox-name":      p.name,
		"io.kubernetes.cri.sandbox-namespace": p.namespace,
		"io.kubernetes.cri.sandbox-uid":       p.uid,
	}
	maps.Copy(p.annotations, s.Annotations)
	return p, nil
}

// newContainer builds a container as containerd's CreateContainer has it just before NRI
// sees it: spec generated from the CRI config (labels, env, CDI devices already injected,
// resources), not yet in the container store. The caller holds m.mu.
func (m *model) newContainer(s containerSpec) (*container, error) {
	if s.ID == "" {
		return nil, fmt.Errorf("a container needs an id")
	}
	if _, ok := m.containers[s.ID]; ok {
		return nil, fmt.Errorf("container %s already exists", s.ID)
	}
	p, ok := m.pods[s.Pod]
	if !ok {
		return nil, fmt.Errorf("container %s: no pod %q", s.ID, s.Pod)
	}
	c := &container{
		id:          s.ID,
		podID:       p.id,
		name:        orDefault(s.Name, s.ID),
		state:       stateCreated,
		cdiDevices:  slices.Clone(s.CDIDevices),
		annotations: maps.Clone(s.Annotations),
		createdAt:   time.Now().UnixNano(),
	}
	if c.annotations == nil {
		c.annotations = map[string]string{}
	}
	c.labels = map[string]string{
		"io.kubernetes.container.name": c.name,
		"io.kubernetes.pod.name":       p.name,
		"io.kubernetes.pod.namespace":  p.namespace,
		"io.kubernetes.pod.uid":        p.uid,
		"io.cri-containerd.kind":       "container",
	}
	maps.Copy(c.labels, s.Labels)

	specAnnotations := map[string]string{
		"io.kubernetes.cri.container-type":    "container",
		"io.kubernetes.cri.container-name":    c.name,
		"io.kubernetes.cri.sandbox-id":        p.id,
		"io.kubernetes.cri.sandbox-name":      p.name,
		"io.kubernetes.cri.sandbox-namespace": p.namespace,
		"io.kubernetes.cri.sandbox-uid":       p.uid,
	}
	maps.Copy(specAnnotations, s.Annotations)
	env := append([]string{defaultPath, "HOSTNAME=" + p.name}, s.Env...)
	for _, e := range env {
		if !strings.Contains(e, "=") {
			return nil, fmt.Errorf("container %s: env entry %q is not K=V", s.ID, e)
		}
	}
	args := s.Args
	if len(args) == 0 {
		args = []string{"/pause"}
	}
	c.spec = &rspec.Spec{
		Version:     rspec.Version,
		Annotations: specAnnotations,
		Process: &rspec.Process{
			Args: slices.Clone(args),
			Env:  env,
			Cwd:  "/",
		},
		Linux: &rspec.Linux{
			CgroupsPath: p.cgroupParent + "/" + c.id,
			Resources:   &rspec.LinuxResources{},
		},
	}
	if s.Resources != nil {
		if err := checkCPUSets(s.Resources.Cpus, s.Resources.Mems); err != nil {
			return nil, fmt.Errorf("container %s: %w", s.ID, err)
		}
		mergeCRIResources(c.spec, s.Resources)
	}
	return c, nil
}

// insertContainer puts c into the store. The caller holds m.mu.
func (m *model) insertContainer(c *container) {
	m.containers[c.id] = c
	m.ctrOrder = append(m.ctrOrder, c.id)
}

// deleteContainer drops c from the store. The caller holds m.mu.
func (m *model) deleteContainer(id string) {
	delete(m.containers, id)
	delete(m.failing, id)
	m.ctrOrder = slices.DeleteFunc(m.ctrOrder, func(s string) bool { return s == id })
}

func (m *model) deletePod(id string) {
	delete(m.pods, id)
	m.podOrder = slices.DeleteFunc(m.podOrder, func(s string) bool { return s == id })
}

func (m *model) start(c *container) {
	c.state = stateRunning
	c.startedAt = time.Now().UnixNano()
	m.nextPid++
	c.pid = m.nextPid
}

func (m *model) stop(c *container, exitCode int32) {
	c.state = stateStopped
	c.finishedAt = time.Now().UnixNano()
	c.exitCode = exitCode
	c.pid = 0
}

// containersOf lists the containers of a pod in creation order. The caller holds m.mu.
func (m *model) containersOf(podID string) []*container {
	var out []*container
	for _, id := range m.ctrOrder {
		if c := m.containers[id]; c.podID == podID {
			out = append(out, c)
		}
	}
	return out
}

// -- NRI views -------------------------------------------------------------------------

// podToNRI is what containerd's podSandboxToNRI makes of a sandbox. The caller holds m.mu.
func (p *pod) toNRI() *api.PodSandbox {
	return &api.PodSandbox{
		Id:             p.id,
		Name:           p.name,
		Uid:            p.uid,
		Namespace:      p.namespace,
		Labels:         maps.Clone(p.labels),
		Annotations:    maps.Clone(p.annotations),
		RuntimeHandler: p.runtimeHandler,
		Linux: &api.LinuxPodSandbox{
			CgroupParent: p.cgroupParent,
			CgroupsPath:  p.cgroupParent,
		},
	}
}

// nriState is the state containerd reports: a container not yet in its store (during
// CreateContainer) is UNKNOWN, a stopped one is reported from its exit event.
func nriState(state string) api.ContainerState {
	switch state {
	case stateCreated:
		return api.ContainerState_CONTAINER_CREATED
	case stateRunning:
		return api.ContainerState_CONTAINER_RUNNING
	case stateStopped:
		return api.ContainerState_CONTAINER_STOPPED
	}
	return api.ContainerState_CONTAINER_UNKNOWN
}

// toNRI is what containerd's containerToNRI makes of a container: spec annotations merged
// with the CRI config's, labels, env, mounts, the spec's Linux resources, and (from
// containerd 2.3) its timestamps, exit code and the CDI devices of the CRI request. The
// caller holds m.mu.
func (c *container) toNRI(state api.ContainerState) *api.Container {
	annotations := maps.Clone(c.spec.Annotations)
	maps.Copy(annotations, c.annotations)
	out := &api.Container{
		Id:           c.id,
		PodSandboxId: c.podID,
		Name:         c.name,
		State:        state,
		Labels:       maps.Clone(c.labels),
		Annotations:  annotations,
		Args:         api.DupStringSlice(c.spec.Process.Args),
		Env:          api.DupStringSlice(c.spec.Process.Env),
		Mounts:       api.FromOCIMounts(c.spec.Mounts),
		Hooks:        api.FromOCIHooks(c.spec.Hooks),
		Pid:          c.pid,
	}
	setStatus(out, c)
	if lnx := c.spec.Linux; lnx != nil {
		out.Linux = &api.LinuxContainer{
			Namespaces:  api.FromOCILinuxNamespaces(lnx.Namespaces),
			Devices:     api.FromOCILinuxDevices(lnx.Devices),
			Resources:   api.FromOCILinuxResources(lnx.Resources, c.spec.Annotations),
			CgroupsPath: lnx.CgroupsPath,
		}
		if c.spec.Process.OOMScoreAdj != nil {
			out.Linux.OomScoreAdj = api.Int(c.spec.Process.OOMScoreAdj)
		}
	}
	setCDIDevices(out, c.cdiDevices)
	return out
}

// snapshot is what containerd's syncPlugin offers: every pod not in an unknown state and
// every container that has not exited. The caller holds m.mu.
func (m *model) snapshot() ([]*api.PodSandbox, []*api.Container) {
	pods := make([]*api.PodSandbox, 0, len(m.pods))
	for _, id := range m.podOrder {
		pods = append(pods, m.pods[id].toNRI())
	}
	ctrs := make([]*api.Container, 0, len(m.containers))
	for _, id := range m.ctrOrder {
		c := m.containers[id]
		if c.state == stateStopped {
			continue
		}
		ctrs = append(ctrs, c.toNRI(nriState(c.state)))
	}
	return pods, ctrs
}

func (c *container) json(withSpec bool) containerJSON {
	res := specResources(c.spec)
	out := containerJSON{
		ID:                 c.id,
		Pod:                c.podID,
		Name:               c.name,
		State:              c.state,
		Labels:             maps.Clone(c.labels),
		Annotations:        maps.Clone(c.spec.Annotations),
		Env:                slices.Clone(c.spec.Process.Env),
		Args:               slices.Clone(c.spec.Process.Args),
		CDIDevices:         nonNil(c.cdiDevices),
		InjectedCDIDevices: nonNil(c.injectedCDI),
		Cpus:               res.Cpus,
		Mems:               res.Mems,
		Resources:          res,
		CreatedAt:          c.createdAt,
		StartedAt:          c.startedAt,
		FinishedAt:         c.finishedAt,
		ExitCode:           c.exitCode,
		Pid:                c.pid,
		Evicted:            c.evicted,
	}
	maps.Copy(out.Annotations, c.annotations)
	if withSpec {
		out.Spec = c.spec
	}
	return out
}

func (p *pod) json(m *model) podJSON {
	ids := []string{}
	for _, c := range m.containersOf(p.id) {
		ids = append(ids, c.id)
	}
	return podJSON{
		ID: p.id, Name: p.name, Namespace: p.namespace, UID: p.uid, State: p.state,
		Labels: maps.Clone(p.labels), Annotations: maps.Clone(p.annotations), Containers: ids,
	}
}

// -- resources -------------------------------------------------------------------------

// specResources reads the resources JSON back from a spec.
func specResources(spec *rspec.Spec) resources {
	var out resources
	if spec.Linux == nil || spec.Linux.Resources == nil {
		return out
	}
	r := spec.Linux.Resources
	if cpu := r.CPU; cpu != nil {
		out.Cpus, out.Mems = cpu.Cpus, cpu.Mems
		out.Shares, out.Quota, out.Period = cpu.Shares, cpu.Quota, cpu.Period
	}
	if mem := r.Memory; mem != nil {
		out.MemoryLimit, out.MemorySwap = mem.Limit, mem.Swap
	}
	if r.Pids != nil {
		out.PidsLimit = pidsLimit(r.Pids)
	}
	if len(r.Unified) > 0 {
		out.Unified = maps.Clone(r.Unified)
	}
	return out
}

// nriResources renders the NRI form (adjustments, updates) as resources JSON.
func nriResources(r *api.LinuxResources) *resources {
	if r == nil {
		return nil
	}
	out := &resources{}
	if cpu := r.Cpu; cpu != nil {
		out.Cpus, out.Mems = cpu.Cpus, cpu.Mems
		if cpu.Shares != nil {
			out.Shares = ptr(cpu.Shares.GetValue())
		}
		if cpu.Quota != nil {
			out.Quota = ptr(cpu.Quota.GetValue())
		}
		if cpu.Period != nil {
			out.Period = ptr(cpu.Period.GetValue())
		}
	}
	if mem := r.Memory; mem != nil {
		if mem.Limit != nil {
			out.MemoryLimit = ptr(mem.Limit.GetValue())
		}
		if mem.Swap != nil {
			out.MemorySwap = ptr(mem.Swap.GetValue())
		}
	}
	if r.Pids != nil {
		out.PidsLimit = ptr(r.Pids.GetLimit())
	}
	if len(r.Unified) > 0 {
		out.Unified = maps.Clone(r.Unified)
	}
	return out
}

// criToNRI is containerd's fromCRILinuxResources: the kubelet's request as NRI sees it in
// UpdateContainer. CPU shares, quota and period and the memory limit are always present
// (zero when the kubelet left them out).
func criToNRI(r *resources) *api.LinuxResources {
	if r == nil {
		return nil
	}
	shares, quota, period, limit := deref(r.Shares), deref(r.Quota), deref(r.Period), deref(r.MemoryLimit)
	out := &api.LinuxResources{
		Cpu: &api.LinuxCPU{
			Shares: api.UInt64(&shares),
			Quota:  api.Int64(&quota),
			Period: api.UInt64(&period),
			Cpus:   r.Cpus,
			Mems:   r.Mems,
		},
		Memory: &api.LinuxMemory{
			Limit: api.Int64(&limit),
		},
	}
	if len(r.Unified) > 0 {
		out.Unified = maps.Clone(r.Unified)
	}
	return out
}

// nriToCRI is containerd's toCRIResources: what survives of an NRI update on its way to
// UpdateContainerResources (CPU, memory limit, unified; nothing else).
func nriToCRI(r *api.LinuxResources) *resources {
	if r == nil {
		return nil
	}
	out := &resources{}
	if r.Memory != nil {
		out.MemoryLimit = ptr(r.Memory.GetLimit().GetValue())
	}
	if r.Cpu != nil {
		out.Shares = ptr(r.Cpu.GetShares().GetValue())
		out.Period = ptr(r.Cpu.GetPeriod().GetValue())
		out.Quota = ptr(r.Cpu.GetQuota().GetValue())
		out.Cpus, out.Mems = r.Cpu.Cpus, r.Cpu.Mems
	}
	if len(r.Unified) > 0 {
		out.Unified = maps.Clone(r.Unified)
	}
	return out
}

// mergeCRIResources merges CRI-style resources into a spec as containerd's WithResources
// option does: a zero or empty value leaves the spec's value alone.
func mergeCRIResources(spec *rspec.Spec, r *resources) {
	if r == nil {
		return
	}
	if spec.Linux == nil {
		spec.Linux = &rspec.Linux{}
	}
	if spec.Linux.Resources == nil {
		spec.Linux.Resources = &rspec.LinuxResources{}
	}
	res := spec.Linux.Resources
	if res.CPU == nil {
		res.CPU = &rspec.LinuxCPU{}
	}
	if res.Memory == nil {
		res.Memory = &rspec.LinuxMemory{}
	}
	if v := deref(r.Period); v != 0 {
		res.CPU.Period = ptr(v)
	}
	if v := deref(r.Quota); v != 0 {
		res.CPU.Quota = ptr(v)
	}
	if v := deref(r.Shares); v != 0 {
		res.CPU.Shares = ptr(v)
	}
	if r.Cpus != "" {
		res.CPU.Cpus = r.Cpus
	}
	if r.Mems != "" {
		res.CPU.Mems = r.Mems
	}
	if v := deref(r.MemoryLimit); v != 0 {
		res.Memory.Limit = ptr(v)
	}
	if len(r.Unified) > 0 {
		if res.Unified == nil {
			res.Unified = map[string]string{}
		}
		maps.Copy(res.Unified, r.Unified)
	}
}

// cloneSpec deep-copies the parts of a spec the harness ever changes in place.
func cloneSpec(s *rspec.Spec) *rspec.Spec {
	out := *s
	out.Annotations = maps.Clone(s.Annotations)
	if s.Process != nil {
		p := *s.Process
		p.Env = slices.Clone(s.Process.Env)
		p.Args = slices.Clone(s.Process.Args)
		out.Process = &p
	}
	if s.Linux != nil {
		l := *s.Linux
		if s.Linux.Resources != nil {
			r := *s.Linux.Resources
			if r.CPU != nil {
				cpu := *r.CPU
				r.CPU = &cpu
			}
			if r.Memory != nil {
				mem := *r.Memory
				r.Memory = &mem
			}
			r.Unified = maps.Clone(r.Unified)
			l.Resources = &r
		}
		out.Linux = &l
	}
	return &out
}

// -- applying updates ------------------------------------------------------------------

// updateOutcome is what became of one ContainerUpdate.
type updateOutcome struct {
	ContainerID   string     `json:"container_id"`
	Resources     *resources `json:"resources"`
	IgnoreFailure bool       `json:"ignore_failure"`
	// "applied", "unknown container" (containerd skips those silently), "failed: ...",
	// or "ignored failure: ..." (ignore_failure set, so not reported back).
	Outcome string `json:"outcome"`
}

// applyUpdates applies plugin-requested updates as containerd's domain table does: a
// container it does not know is skipped, a failed update leaves the container as it was
// and is reported as failed unless the plugin set ignore_failure. It returns what
// containerd returns: the failed updates and, if there are any, an error. The caller
// holds the runtime's NRI lock, not m.mu.
func (m *model) applyUpdates(updates []*api.ContainerUpdate) ([]*api.ContainerUpdate, []updateOutcome, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	var failed []*api.ContainerUpdate
	outcomes := make([]updateOutcome, 0, len(updates))
	for _, u := range updates {
		if u == nil {
			continue
		}
		o := updateOutcome{
			ContainerID:   u.ContainerId,
			Resources:     nriResources(u.GetLinux().GetResources()),
			IgnoreFailure: u.IgnoreFailure,
		}
		err := m.updateResources(u.ContainerId, nriToCRI(u.GetLinux().GetResources()))
		switch {
		case err == errUnknownContainer:
			o.Outcome = "unknown container"
		case err != nil && u.IgnoreFailure:
			o.Outcome = "ignored failure: " + err.Error()
		case err != nil:
			o.Outcome = "failed: " + err.Error()
			failed = append(failed, u)
		default:
			o.Outcome = "applied"
		}
		outcomes = append(outcomes, o)
	}
	if len(failed) > 0 {
		return failed, outcomes, fmt.Errorf("NRI update of some containers failed")
	}
	return nil, outcomes, nil
}

var errUnknownContainer = fmt.Errorf("unknown container")

// updateResources is containerd's updateContainerResources for one container: merge the
// CRI resources into a copy of the spec; a running container's cgroups are updated too,
// which fails for CPUs or memory nodes that are not online (as the kernel refuses them).
// On failure the spec stays as it was. The caller holds m.mu.
func (m *model) updateResources(id string, r *resources) error {
	c, ok := m.containers[id]
	if !ok {
		return errUnknownContainer
	}
	if msg, ok := m.failing[id]; ok {
		return fmt.Errorf("failed to update resources: %s", msg)
	}
	if c.removing {
		return fmt.Errorf("container %q is in removing state", id)
	}
	if r == nil {
		return nil
	}
	spec := cloneSpec(c.spec)
	mergeCRIResources(spec, r)
	if c.state == stateRunning {
		if err := m.checkOnline(spec); err != nil {
			return fmt.Errorf("failed to update resources: %w", err)
		}
	}
	c.spec = spec
	return nil
}

// checkOnline fails as writing the spec's cpuset into the cgroup would.
func (m *model) checkOnline(spec *rspec.Spec) error {
	r := specResources(spec)
	if err := checkCPUSets(r.Cpus, r.Mems); err != nil {
		return err
	}
	if r.Cpus != "" && m.onlineCPUs != nil {
		set, _ := cpuset.Parse(r.Cpus)
		if extra := set.Minus(m.onlineCPUs); len(extra) > 0 {
			return fmt.Errorf("write cpuset.cpus %q: invalid argument (CPUs %s not online)", r.Cpus, extra)
		}
	}
	if r.Mems != "" && m.onlineMems != nil {
		set, _ := cpuset.Parse(r.Mems)
		if extra := set.Minus(m.onlineMems); len(extra) > 0 {
			return fmt.Errorf("write cpuset.mems %q: invalid argument (nodes %s not online)", r.Mems, extra)
		}
	}
	return nil
}

func checkCPUSets(cpus, mems string) error {
	if _, err := cpuset.Parse(cpus); err != nil {
		return fmt.Errorf("cpus: %w", err)
	}
	if _, err := cpuset.Parse(mems); err != nil {
		return fmt.Errorf("mems: %w", err)
	}
	return nil
}

// -- small helpers ---------------------------------------------------------------------

func orDefault(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

func ptr[T any](v T) *T { return &v }

func deref[T any](p *T) T {
	var zero T
	if p == nil {
		return zero
	}
	return *p
}

func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return slices.Clone(s)
}

// pidsLimit reads the pids limit whichever runtime-spec release the build uses (an int64
// before v1.3.0, a pointer since).
func pidsLimit(p *rspec.LinuxPids) *int64 {
	data, err := json.Marshal(p)
	if err != nil {
		return nil
	}
	var v struct {
		Limit *int64 `json:"limit"`
	}
	if json.Unmarshal(data, &v) != nil {
		return nil
	}
	return v.Limit
}
