package main

import (
	"context"
	"fmt"
	"slices"
	"sync"

	"github.com/go-logr/logr"
	"k8s.io/kubernetes/pkg/kubelet/pluginmanager/cache"
)

// plugin is one DRA plugin registration as the kubelet accepted it.
type plugin struct {
	Driver        string   `json:"driver"`
	Endpoint      string   `json:"endpoint"`
	Versions      []string `json:"versions"`
	ChosenService string   `json:"chosen_service"`
}

// sliceWipe is one successful deletion of the node's ResourceSlices by the
// kubelet's DRA plugin manager: at start-up for all drivers (Driver empty),
// and some time after the last plugin of a driver went away.
type sliceWipe struct {
	Driver        string `json:"driver"`
	FieldSelector string `json:"field_selector"`
}

// observer records what the kubelet code did, for the test to query and
// wait on. changed is closed and replaced on every change.
type observer struct {
	mu      sync.Mutex
	plugins []plugin
	chosen  map[[2]string]string // (driver, endpoint) -> chosen service
	wipes   []sliceWipe
	// refusals holds, per driver, why the kubelet last refused a plugin.
	refusals map[string]string
	changed  chan struct{}
}

func newObserver() *observer {
	return &observer{chosen: map[[2]string]string{}, refusals: map[string]string{}, changed: make(chan struct{})}
}

// notifyLocked wakes all waiters; the mutex must be held.
func (o *observer) notifyLocked() {
	close(o.changed)
	o.changed = make(chan struct{})
}

func (o *observer) registered(driver, endpoint string, versions []string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.plugins = slices.DeleteFunc(o.plugins, func(p plugin) bool { return p.Driver == driver && p.Endpoint == endpoint })
	o.plugins = append(o.plugins, plugin{
		Driver:        driver,
		Endpoint:      endpoint,
		Versions:      slices.Clone(versions),
		ChosenService: o.chosen[[2]string{driver, endpoint}],
	})
	o.notifyLocked()
}

func (o *observer) unregistered(driver, endpoint string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.plugins = slices.DeleteFunc(o.plugins, func(p plugin) bool { return p.Driver == driver && p.Endpoint == endpoint })
	o.notifyLocked()
}

func (o *observer) refused(driver string, err error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.refusals[driver] = err.Error()
	o.notifyLocked()
}

func (o *observer) waitRefused(ctx context.Context, driver string) (string, error) {
	var refusal string
	err := o.waitFor(ctx, func() bool {
		refusal = o.refusals[driver]
		return refusal != ""
	})
	return refusal, err
}

func (o *observer) refusal(driver string) string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.refusals[driver]
}

func (o *observer) registrations() []plugin {
	o.mu.Lock()
	defer o.mu.Unlock()
	return slices.Clone(o.plugins)
}

func (o *observer) sliceWipes() []sliceWipe {
	o.mu.Lock()
	defer o.mu.Unlock()
	return slices.Clone(o.wipes)
}

// waitFor blocks until check returns true (with the mutex held) or ctx ends.
func (o *observer) waitFor(ctx context.Context, check func() bool) error {
	for {
		o.mu.Lock()
		ok := check()
		changed := o.changed
		o.mu.Unlock()
		if ok {
			return nil
		}
		select {
		case <-ctx.Done():
			if ctx.Err() == context.DeadlineExceeded {
				return errTimeout
			}
			return ctx.Err()
		case <-changed:
		}
	}
}

func (o *observer) waitRegistered(ctx context.Context, driver string) (plugin, error) {
	var found plugin
	err := o.waitFor(ctx, func() bool {
		for i := len(o.plugins) - 1; i >= 0; i-- {
			if o.plugins[i].Driver == driver {
				found = o.plugins[i]
				return true
			}
		}
		return false
	})
	return found, err
}

func (o *observer) waitUnregistered(ctx context.Context, driver string) error {
	return o.waitFor(ctx, func() bool {
		return !slices.ContainsFunc(o.plugins, func(p plugin) bool { return p.Driver == driver })
	})
}

func (o *observer) waitSliceWipe(ctx context.Context, driver string) error {
	return o.waitFor(ctx, func() bool {
		return slices.ContainsFunc(o.wipes, func(w sliceWipe) bool { return w.Driver == driver })
	})
}

// observeLog picks facts out of the kubelet's structured log entries.
// These messages and keys are those of pkg/kubelet/cm/dra/plugin at the
// pinned Kubernetes version.
func (o *observer) observeLog(msg string, keysAndValues []any) {
	switch msg {
	case "Registered DRA plugin":
		driver, endpoint, service := logValue(keysAndValues, "driverName"), logValue(keysAndValues, "endpoint"), logValue(keysAndValues, "chosenService")
		o.mu.Lock()
		o.chosen[[2]string{driver, endpoint}] = service
		o.mu.Unlock()
	case "Deleted ResourceSlices":
		selector := logValue(keysAndValues, "fieldSelector")
		o.mu.Lock()
		o.wipes = append(o.wipes, sliceWipe{Driver: driverOfSelector(keysAndValues), FieldSelector: selector})
		o.notifyLocked()
		o.mu.Unlock()
	}
}

func logValue(keysAndValues []any, key string) string {
	for i := 0; i+1 < len(keysAndValues); i += 2 {
		if k, ok := keysAndValues[i].(string); ok && k == key {
			return fmt.Sprint(keysAndValues[i+1])
		}
	}
	return ""
}

// driverOfSelector extracts the driver from the fields.Set that the kubelet
// logs as fieldSelector (a map from field to value).
func driverOfSelector(keysAndValues []any) string {
	for i := 0; i+1 < len(keysAndValues); i += 2 {
		if k, ok := keysAndValues[i].(string); ok && k == "fieldSelector" {
			if set, ok := keysAndValues[i+1].(interface{ Get(string) string }); ok {
				return set.Get("spec.driver")
			}
		}
	}
	return ""
}

// observingSink is a logr.LogSink that hands every entry up to V(5) to the
// observer and passes entries on to the real sink at its own verbosity.
type observingSink struct {
	base   logr.LogSink
	values []any
	obs    *observer
}

// observedLevel is the highest verbosity the observer needs to see
// ("Registered DRA plugin" and "Deleted ResourceSlices" are logged at V(3)).
const observedLevel = 5

func newObservingSink(base logr.LogSink, obs *observer) logr.LogSink {
	if withDepth, ok := base.(logr.CallDepthLogSink); ok {
		base = withDepth.WithCallDepth(1)
	}
	return &observingSink{base: base, obs: obs}
}

func (s *observingSink) Init(info logr.RuntimeInfo) { s.base.Init(info) }

func (s *observingSink) Enabled(level int) bool {
	return level <= observedLevel || s.base.Enabled(level)
}

func (s *observingSink) Info(level int, msg string, keysAndValues ...any) {
	if level <= observedLevel {
		all := make([]any, 0, len(s.values)+len(keysAndValues))
		all = append(append(all, s.values...), keysAndValues...)
		s.obs.observeLog(msg, all)
	}
	if s.base.Enabled(level) {
		s.base.Info(level, msg, keysAndValues...)
	}
}

func (s *observingSink) Error(err error, msg string, keysAndValues ...any) {
	s.base.Error(err, msg, keysAndValues...)
}

func (s *observingSink) WithValues(keysAndValues ...any) logr.LogSink {
	return &observingSink{base: s.base.WithValues(keysAndValues...), values: append(slices.Clone(s.values), keysAndValues...), obs: s.obs}
}

func (s *observingSink) WithName(name string) logr.LogSink {
	return &observingSink{base: s.base.WithName(name), values: s.values, obs: s.obs}
}

// observingHandler wraps the DRA manager's plugin handler. It changes
// nothing about registration; it records which plugins the kubelet
// accepted so that tests can wait for them.
type observingHandler struct {
	inner cache.PluginHandler
	obs   *observer
}

// validated records the outcome of ValidatePlugin (whose signature differs between
// Kubernetes releases: see the kubelet_*.go files).
func (h *observingHandler) validated(name string, err error) error {
	if err != nil {
		h.obs.refused(name, err)
	}
	return err
}

// registeredWith records the outcome of RegisterPlugin.
func (h *observingHandler) registeredWith(name, endpoint string, versions []string, err error) error {
	if err != nil {
		h.obs.refused(name, err)
		return err
	}
	h.obs.registered(name, endpoint, versions)
	return nil
}
