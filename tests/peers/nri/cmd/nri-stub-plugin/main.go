// Command nri-stub-plugin is a small CPU pinning NRI plugin on the official plugin library
// (github.com/containerd/nri/pkg/stub): the reference the harness's own tests run against,
// and the Go baseline for benchmarks.
//
// It pins every container that holds claims to the union of its claims' CPUs and memory
// nodes, and every other container to the shared pool: the online CPUs no claim holds. A
// container's claims are read from its CDI device names (<driver>/device=claim-<uid>-<n>),
// or, where the runtime passes none, from the names of its environment variables
// (DRA_CPUSET_<uid, "-" as "_">_<n>). The claims come from a JSON file,
//
//	{"<claim uid>": {"cpus": "2-3", "mems": "0"}, ...}
//
// read at start and again on SIGHUP; after a reload it sends unsolicited UpdateContainers
// for the containers whose pinning changed (with --ignore-failure, marked so). It
// reconnects when the runtime goes away.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/containerd/nri/pkg/api"
	"github.com/containerd/nri/pkg/stub"

	"nodedra.test/nri/internal/cpuset"
)

const (
	envPrefix   = "DRA_CPUSET_"
	claimPrefix = "claim-"
)

type claim struct {
	Cpus string `json:"cpus"`
	Mems string `json:"mems"`
}

// tracked is what the plugin knows of a container.
type tracked struct {
	id     string
	cdi    []string // claim UIDs found in CDI device names
	env    []string // claim UIDs, "-" as "_", found in environment variable names
	cpus   string   // as last seen or set
	mems   string
	pinned string // "claims" or "shared", for the log
}

type pinner struct {
	claimsFile    string
	driver        string
	online        cpuset.Set
	onlineMems    string
	ignoreFailure bool // set ignore_failure on unsolicited updates

	mu         sync.Mutex
	claims     map[string]claim
	containers map[string]*tracked
	stub       stub.Stub
}

func main() {
	var (
		socket     = flag.String("socket", api.DefaultSocketPath, "NRI socket of the runtime")
		name       = flag.String("name", "stub-pinning", "plugin name")
		idx        = flag.String("idx", "10", "plugin index (two digits)")
		driver     = flag.String("driver", "", "DRA driver whose CDI devices name claims (default: any)")
		claimsFile = flag.String("claims", "", "JSON file of claim UID -> {cpus, mems}, re-read on SIGHUP (default: no claims)")
		onlineCPUs = flag.String("online-cpus", "", "the node's online CPUs, e.g. 0-15 (required)")
		onlineMems = flag.String("online-mems", "", "memory nodes of the shared pool (default: leave mems alone)")
		retry      = flag.Duration("reconnect-delay", 100*time.Millisecond, "pause before reconnecting to the runtime")
		ignore     = flag.Bool("ignore-failure", false, "mark unsolicited updates ignore_failure")
	)
	flag.Parse()
	online, err := cpuset.Parse(*onlineCPUs)
	if err != nil || len(online) == 0 {
		fatalf("--online-cpus %q: a non-empty CPU list is required", *onlineCPUs)
	}
	p := &pinner{
		claimsFile:    *claimsFile,
		driver:        *driver,
		online:        online,
		onlineMems:    *onlineMems,
		ignoreFailure: *ignore,
		containers:    map[string]*tracked{},
	}
	if err := p.loadClaims(); err != nil {
		fatalf("%v", err)
	}

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	go func() {
		for range hup {
			p.reload()
		}
	}()
	p.run(ctx, *socket, *name, *idx, *retry)
}

// run keeps the plugin connected: a new stub for every connection, as a plugin must
// register again whenever the runtime restarts.
func (p *pinner) run(ctx context.Context, socket, name, idx string, retry time.Duration) {
	for ctx.Err() == nil {
		closed := make(chan struct{})
		var once sync.Once
		s, err := stub.New(p,
			stub.WithSocketPath(socket),
			stub.WithPluginName(name),
			stub.WithPluginIdx(idx),
			stub.WithOnClose(func() { once.Do(func() { close(closed) }) }),
		)
		if err != nil {
			fatalf("cannot create plugin: %v", err)
		}
		if err := s.Start(ctx); err != nil {
			logf("cannot connect to %s: %v", socket, err)
			s.Stop()
			sleep(ctx, retry)
			continue
		}
		logf("connected to %s as %s-%s", socket, idx, name)
		p.mu.Lock()
		p.stub = s
		p.mu.Unlock()
		select {
		case <-closed:
			logf("connection to the runtime closed; reconnecting")
		case <-ctx.Done():
		}
		p.mu.Lock()
		p.stub = nil
		p.mu.Unlock()
		s.Stop()
		sleep(ctx, retry)
	}
}

// -- the plugin's handlers -----------------------------------------------------------------

// Configure subscribes to what the plugin implements (events = 0 means that).
func (p *pinner) Configure(_ context.Context, config, runtime, version string) (api.EventMask, error) {
	logf("configured by %s %s", runtime, version)
	return 0, nil
}

// Synchronize brings every container to its pinning.
func (p *pinner) Synchronize(_ context.Context, pods []*api.PodSandbox, ctrs []*api.Container) ([]*api.ContainerUpdate, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.containers = map[string]*tracked{}
	var updates []*api.ContainerUpdate
	for _, c := range ctrs {
		t := p.track(c)
		if u := p.repin(t); u != nil {
			updates = append(updates, u)
		}
	}
	logf("synchronized: %d pods, %d containers, %d updates", len(pods), len(ctrs), len(updates))
	return updates, nil
}

// CreateContainer pins the new container.
func (p *pinner) CreateContainer(_ context.Context, pod *api.PodSandbox, c *api.Container) (*api.ContainerAdjustment, []*api.ContainerUpdate, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	t := p.track(c)
	cpus, mems, kind := p.desired(t)
	adjust := &api.ContainerAdjustment{}
	if cpus != "" {
		adjust.SetLinuxCPUSetCPUs(cpus)
		t.cpus = cpus
	}
	if mems != "" {
		adjust.SetLinuxCPUSetMems(mems)
		t.mems = mems
	}
	t.pinned = kind
	logf("create %s (%s/%s): %s cpus=%q mems=%q", c.Id, pod.GetNamespace(), pod.GetName(), kind, cpus, mems)
	return adjust, nil, nil
}

// UpdateContainer keeps the pinning when the kubelet updates a container's resources.
func (p *pinner) UpdateContainer(_ context.Context, _ *api.PodSandbox, c *api.Container, _ *api.LinuxResources) ([]*api.ContainerUpdate, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	t, ok := p.containers[c.Id]
	if !ok {
		t = p.track(c)
	}
	cpus, mems, _ := p.desired(t)
	if cpus == "" && mems == "" {
		return nil, nil
	}
	u := &api.ContainerUpdate{ContainerId: c.Id}
	if cpus != "" {
		u.SetLinuxCPUSetCPUs(cpus)
		t.cpus = cpus
	}
	if mems != "" {
		u.SetLinuxCPUSetMems(mems)
		t.mems = mems
	}
	logf("update %s: keep cpus=%q mems=%q", c.Id, cpus, mems)
	return []*api.ContainerUpdate{u}, nil
}

// StopContainer: a stopped container's CPUs are not given to anyone else (its claims
// still hold them), so nothing changes.
func (p *pinner) StopContainer(_ context.Context, _ *api.PodSandbox, c *api.Container) ([]*api.ContainerUpdate, error) {
	logf("stop %s", c.Id)
	return nil, nil
}

// RemoveContainer forgets the container.
func (p *pinner) RemoveContainer(_ context.Context, _ *api.PodSandbox, c *api.Container) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.containers, c.Id)
	logf("remove %s", c.Id)
	return nil
}

// -- pinning -------------------------------------------------------------------------------

// track records a container and the claims it holds. The caller holds p.mu.
func (p *pinner) track(c *api.Container) *tracked {
	t := &tracked{id: c.Id}
	for _, name := range cdiNames(c) {
		if uid, ok := p.claimOfDevice(name); ok {
			t.cdi = append(t.cdi, uid)
		}
	}
	if len(t.cdi) == 0 {
		for _, kv := range c.Env {
			name, _, _ := strings.Cut(kv, "=")
			if key, ok := claimOfEnv(name); ok {
				t.env = append(t.env, key)
			}
		}
	}
	if cpu := c.GetLinux().GetResources().GetCpu(); cpu != nil {
		t.cpus, t.mems = cpu.Cpus, cpu.Mems
	}
	p.containers[c.Id] = t
	return t
}

// claimOfDevice reads the claim UID out of "<driver>/device=claim-<uid>-<index>".
func (p *pinner) claimOfDevice(name string) (string, bool) {
	kind, device, ok := strings.Cut(name, "=")
	if !ok {
		return "", false
	}
	vendor, class, ok := strings.Cut(kind, "/")
	if !ok || class != "device" || (p.driver != "" && vendor != p.driver) {
		return "", false
	}
	rest, ok := strings.CutPrefix(device, claimPrefix)
	if !ok {
		return "", false
	}
	i := strings.LastIndex(rest, "-")
	if i <= 0 || !isDigits(rest[i+1:]) {
		return "", false
	}
	return rest[:i], true
}

// claimOfEnv reads the claim UID ("-" as "_") out of "DRA_CPUSET_<uid>_<index>".
func claimOfEnv(name string) (string, bool) {
	rest, ok := strings.CutPrefix(name, envPrefix)
	if !ok {
		return "", false
	}
	i := strings.LastIndex(rest, "_")
	if i <= 0 || !isDigits(rest[i+1:]) {
		return "", false
	}
	return rest[:i], true
}

// desired is where a container belongs: the union of its known claims, or the shared
// pool. The caller holds p.mu.
func (p *pinner) desired(t *tracked) (cpus, mems, kind string) {
	heldCPUs, heldMems := cpuset.Set{}, cpuset.Set{}
	found := false
	for uid, cl := range p.claims {
		if !t.holds(uid) {
			continue
		}
		found = true
		c, _ := cpuset.Parse(cl.Cpus)
		m, _ := cpuset.Parse(cl.Mems)
		heldCPUs.Add(c)
		heldMems.Add(m)
	}
	if found {
		return heldCPUs.String(), heldMems.String(), "claims"
	}
	return p.shared().String(), p.onlineMems, "shared"
}

func (t *tracked) holds(uid string) bool {
	for _, u := range t.cdi {
		if u == uid {
			return true
		}
	}
	munged := strings.ReplaceAll(uid, "-", "_")
	for _, u := range t.env {
		if u == munged {
			return true
		}
	}
	return false
}

// shared is the online CPUs no claim holds. The caller holds p.mu.
func (p *pinner) shared() cpuset.Set {
	claimed := cpuset.Set{}
	for _, cl := range p.claims {
		c, _ := cpuset.Parse(cl.Cpus)
		claimed.Add(c)
	}
	return p.online.Minus(claimed)
}

// repin returns the update that brings a container to its pinning, or nil if it is
// there. The caller holds p.mu.
func (p *pinner) repin(t *tracked) *api.ContainerUpdate {
	cpus, mems, kind := p.desired(t)
	t.pinned = kind
	var u *api.ContainerUpdate
	if cpus != "" && cpus != t.cpus {
		u = &api.ContainerUpdate{ContainerId: t.id}
		u.SetLinuxCPUSetCPUs(cpus)
	}
	if mems != "" && mems != t.mems {
		if u == nil {
			u = &api.ContainerUpdate{ContainerId: t.id}
		}
		u.SetLinuxCPUSetMems(mems)
	}
	if u != nil {
		t.cpus, t.mems = orKeep(cpus, t.cpus), orKeep(mems, t.mems)
	}
	return u
}

// -- claims --------------------------------------------------------------------------------

func (p *pinner) loadClaims() error {
	claims := map[string]claim{}
	if p.claimsFile != "" {
		data, err := os.ReadFile(p.claimsFile)
		if err != nil {
			return fmt.Errorf("claims: %w", err)
		}
		if err := json.Unmarshal(data, &claims); err != nil {
			return fmt.Errorf("claims file %s: %w", p.claimsFile, err)
		}
		for uid, cl := range claims {
			if _, err := cpuset.Parse(cl.Cpus); err != nil {
				return fmt.Errorf("claim %s: cpus: %w", uid, err)
			}
			if _, err := cpuset.Parse(cl.Mems); err != nil {
				return fmt.Errorf("claim %s: mems: %w", uid, err)
			}
		}
	}
	p.mu.Lock()
	p.claims = claims
	p.mu.Unlock()
	return nil
}

// reload re-reads the claims and tells the runtime, unsolicited, about every container
// whose pinning changed.
func (p *pinner) reload() {
	if err := p.loadClaims(); err != nil {
		logf("reload: %v (claims unchanged)", err)
		return
	}
	p.mu.Lock()
	s := p.stub
	ids := make([]string, 0, len(p.containers))
	for id := range p.containers {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	var updates []*api.ContainerUpdate
	for _, id := range ids {
		if u := p.repin(p.containers[id]); u != nil {
			u.IgnoreFailure = p.ignoreFailure
			updates = append(updates, u)
		}
	}
	p.mu.Unlock()
	logf("claims reloaded: %d claims, %d containers to repin", len(p.claims), len(updates))
	if len(updates) == 0 {
		return
	}
	if s == nil {
		logf("not connected; the next synchronization will repin them")
		return
	}
	failed, err := s.UpdateContainers(updates)
	if err != nil || len(failed) > 0 {
		logf("unsolicited update: %d failed: %v", len(failed), err)
		return
	}
	logf("unsolicited update of %d containers done", len(updates))
}

// -- helpers -------------------------------------------------------------------------------

func isDigits(s string) bool {
	if s == "" {
		return false
	}
	for _, r := range s {
		if r < '0' || r > '9' {
			return false
		}
	}
	return true
}

func orKeep(v, old string) string {
	if v == "" {
		return old
	}
	return v
}

func sleep(ctx context.Context, d time.Duration) {
	select {
	case <-time.After(d):
	case <-ctx.Done():
	}
}

func logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "%s nri-stub-plugin: %s\n", time.Now().Format("15:04:05.000000"), fmt.Sprintf(format, args...))
}

func fatalf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "nri-stub-plugin: %s\n", fmt.Sprintf(format, args...))
	os.Exit(2)
}
