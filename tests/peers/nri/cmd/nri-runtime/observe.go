package main

// Observation: what the tests want to know about the conversation between the adaptation
// and its plugins, which the adaptation does not expose. It is taken from three places,
// none of which changes what the adaptation does:
//   - the ttrpc client interceptor on the runtime -> plugin connection (every request the
//     adaptation sends: Configure, each Synchronize chunk, each event), the same slot
//     containerd fills with its OpenTelemetry interceptor;
//   - the ttrpc server interceptor on the plugin -> runtime connection (RegisterPlugin);
//   - the adaptation's own log lines (a plugin synchronized, a connection closed, a plugin
//     dropped), matched by their format strings.

import (
	"context"
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/containerd/nri/pkg/api"
	"github.com/containerd/ttrpc"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
)

// maxEvents bounds the event log; older entries are dropped (their count is kept).
const maxEvents = 100000

// pluginRecord is one connection of a plugin, from registration on.
type pluginRecord struct {
	Name         string `json:"name"` // "<idx>-<base>", as the adaptation names it
	Index        string `json:"index"`
	Base         string `json:"base"`
	Generation   int    `json:"generation"` // which start of the adaptation it connected to
	RegisteredAt int64  `json:"registered_at"`
	Events       int32  `json:"events"` // subscription mask from its ConfigureResponse
	Synchronized bool   `json:"synchronized"`
	SyncedAt     int64  `json:"synced_at,omitempty"`
	Closed       bool   `json:"closed"`
	ClosedAt     int64  `json:"closed_at,omitempty"`
	Dropped      string `json:"dropped,omitempty"` // why the adaptation closed it
}

// syncChunk is one SynchronizeRequest as it went out (or was refused as too big).
type syncChunk struct {
	Pods       int    `json:"pods"`
	Containers int    `json:"containers"`
	More       bool   `json:"more"`
	Bytes      int    `json:"bytes"`
	Ns         int64  `json:"ns"`
	Updates    int    `json:"updates"`
	Error      string `json:"error,omitempty"`
}

// syncRecord is one Synchronize of one plugin, as containerd's syncPlugin runs it.
type syncRecord struct {
	Plugin     string          `json:"plugin"`
	Generation int             `json:"generation"`
	At         int64           `json:"at"` // unix ns when the runtime started it
	Pods       int             `json:"pods"`
	Containers int             `json:"containers"`
	Ns         int64           `json:"ns"` // the plugin's part: the adaptation's sync callback
	Updates    int             `json:"updates"`
	Outcomes   []updateOutcome `json:"outcomes"`
	Chunks     []syncChunk     `json:"chunks"`
	Error      string          `json:"error,omitempty"`
	Done       bool            `json:"done"`
}

// unsolicitedRecord is one UpdateContainers call of a plugin.
type unsolicitedRecord struct {
	At       int64           `json:"at"`
	Updates  int             `json:"updates"`
	Outcomes []updateOutcome `json:"outcomes"`
	// What the runtime answered: the failed updates and the error (containerd returns an
	// error whenever an update failed, so the plugin sees a failed call).
	Failed []string `json:"failed"`
	Error  string   `json:"error,omitempty"`
}

// refusal is a plugin connection the adaptation gave up on before it was synchronized:
// registration refused or timed out, Configure failed or answered with invalid events.
type refusal struct {
	At     int64  `json:"at"`
	Plugin string `json:"plugin,omitempty"` // empty if it never registered
	Error  string `json:"error"`
}

// eventRecord is one request the adaptation sent to a plugin (other than Synchronize).
type eventRecord struct {
	Seq       int    `json:"seq"`
	At        int64  `json:"at"`
	Method    string `json:"method"` // ttrpc method: CreateContainer, StateChange, StartContainer...
	Event     string `json:"event"`  // NRI event name, e.g. START_CONTAINER (also for StateChange)
	Pod       string `json:"pod,omitempty"`
	Container string `json:"container,omitempty"`
	Ns        int64  `json:"ns"`
	Error     string `json:"error,omitempty"`
}

type observer struct {
	mu          sync.Mutex
	changed     chan struct{}
	generation  int
	plugins     []*pluginRecord
	syncs       []*syncRecord
	current     *syncRecord // the sync in progress (syncs are serial)
	unsolicited []*unsolicitedRecord
	refusals    []refusal
	events      []eventRecord
	eventsSeen  int
	debug       bool
}

func newObserver(debug bool) *observer {
	return &observer{changed: make(chan struct{}), debug: debug}
}

// notify wakes every waiter. The caller holds o.mu.
func (o *observer) notify() {
	close(o.changed)
	o.changed = make(chan struct{})
}

// wait blocks until cond (called with o.mu held) is true or ctx ends.
func (o *observer) wait(ctx context.Context, cond func() bool) error {
	for {
		o.mu.Lock()
		if cond() {
			o.mu.Unlock()
			return nil
		}
		ch := o.changed
		o.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// lastPlugin is the plugin being registered, configured or synchronized: the adaptation
// accepts connections one at a time. The caller holds o.mu.
func (o *observer) lastPlugin() *pluginRecord {
	if len(o.plugins) == 0 {
		return nil
	}
	return o.plugins[len(o.plugins)-1]
}

// plugin finds the newest record of a plugin name. The caller holds o.mu.
func (o *observer) plugin(name string) *pluginRecord {
	for i := len(o.plugins) - 1; i >= 0; i-- {
		if o.plugins[i].Name == name {
			return o.plugins[i]
		}
	}
	return nil
}

// -- ttrpc interceptors ----------------------------------------------------------------

// clientInterceptor sees every request from the adaptation to a plugin.
func (o *observer) clientInterceptor(ctx context.Context, req *ttrpc.Request, resp *ttrpc.Response, info *ttrpc.UnaryClientInfo, invoke ttrpc.Invoker) error {
	start := time.Now()
	err := invoke(ctx, req, resp)
	elapsed := time.Since(start).Nanoseconds()
	if err == nil && resp.Status != nil && resp.Status.Code != 0 {
		err = fmt.Errorf("plugin answered status %d: %s", resp.Status.Code, resp.Status.Message)
	}
	switch req.Method {
	case "Synchronize":
		o.recordSyncChunk(req, resp, elapsed, err)
	case "Configure":
		if err == nil {
			var rpl api.ConfigureResponse
			if proto.Unmarshal(resp.Payload, &rpl) == nil {
				o.mu.Lock()
				if p := o.lastPlugin(); p != nil {
					p.Events = rpl.Events
				}
				o.notify()
				o.mu.Unlock()
			}
		}
	default:
		o.recordEvent(req, start, elapsed, err)
	}
	return err
}

func (o *observer) recordSyncChunk(req *ttrpc.Request, resp *ttrpc.Response, elapsed int64, err error) {
	var sreq api.SynchronizeRequest
	_ = proto.Unmarshal(req.Payload, &sreq)
	chunk := syncChunk{
		Pods: len(sreq.Pods), Containers: len(sreq.Containers), More: sreq.More,
		Bytes: len(req.Payload), Ns: elapsed,
	}
	if err != nil {
		chunk.Error = err.Error()
	} else {
		var rpl api.SynchronizeResponse
		if proto.Unmarshal(resp.Payload, &rpl) == nil {
			chunk.Updates = len(rpl.Update)
		}
	}
	o.mu.Lock()
	if o.current != nil {
		o.current.Chunks = append(o.current.Chunks, chunk)
	}
	o.mu.Unlock()
	more := ""
	if chunk.More {
		more = " more"
	}
	logf("sync chunk: %d pods, %d containers, %d bytes%s (%s)", chunk.Pods, chunk.Containers, chunk.Bytes, more, orDefault(chunk.Error, "ok"))
}

func (o *observer) recordEvent(req *ttrpc.Request, start time.Time, elapsed int64, err error) {
	ev := eventRecord{At: start.UnixNano(), Method: req.Method, Ns: elapsed}
	if err != nil {
		ev.Error = err.Error()
	}
	if req.Method == "StateChange" {
		// StateChangeEvent: event = 1, pod = 2, container = 3.
		var kind int32
		ev.Pod, ev.Container, kind = idsOf(req.Payload, 2, 3)
		ev.Event = api.Event(kind).String()
	} else {
		// Every other request: pod = 1, container = 2.
		ev.Pod, ev.Container, _ = idsOf(req.Payload, 1, 2)
		ev.Event = eventOfMethod(req.Method)
	}
	o.mu.Lock()
	o.eventsSeen++
	ev.Seq = o.eventsSeen
	o.events = append(o.events, ev)
	if len(o.events) > maxEvents {
		o.events = o.events[len(o.events)-maxEvents:]
	}
	o.notify()
	o.mu.Unlock()
}

// eventOfMethod names the NRI event a dedicated request carries.
func eventOfMethod(method string) string {
	names := map[string]string{
		"RunPodSandbox": "RUN_POD_SANDBOX", "StopPodSandbox": "STOP_POD_SANDBOX",
		"RemovePodSandbox": "REMOVE_POD_SANDBOX", "UpdatePodSandbox": "UPDATE_POD_SANDBOX",
		"PostUpdatePodSandbox": "POST_UPDATE_POD_SANDBOX", "CreateContainer": "CREATE_CONTAINER",
		"PostCreateContainer": "POST_CREATE_CONTAINER", "StartContainer": "START_CONTAINER",
		"PostStartContainer": "POST_START_CONTAINER", "UpdateContainer": "UPDATE_CONTAINER",
		"PostUpdateContainer": "POST_UPDATE_CONTAINER", "StopContainer": "STOP_CONTAINER",
		"RemoveContainer": "REMOVE_CONTAINER", "ValidateContainerAdjustment": "VALIDATE_CONTAINER_ADJUSTMENT",
	}
	if name, ok := names[method]; ok {
		return name
	}
	return method
}

// idsOf reads, without knowing the message type, the id (field 1) of the pod and of the
// container a request carries in the given fields, and the varint in field 1 if any.
func idsOf(payload []byte, podField, ctrField protowire.Number) (podID, ctrID string, kind int32) {
	for len(payload) > 0 {
		num, typ, n := protowire.ConsumeTag(payload)
		if n < 0 {
			return
		}
		payload = payload[n:]
		switch {
		case typ == protowire.BytesType && (num == podField || num == ctrField):
			msg, m := protowire.ConsumeBytes(payload)
			if m < 0 {
				return
			}
			if id := firstString(msg); num == podField {
				podID = id
			} else {
				ctrID = id
			}
			n = m
		case typ == protowire.VarintType && num == 1:
			v, m := protowire.ConsumeVarint(payload)
			if m < 0 {
				return
			}
			kind = int32(v)
			n = m
		default:
			n = protowire.ConsumeFieldValue(num, typ, payload)
			if n < 0 {
				return
			}
		}
		payload = payload[n:]
	}
	return
}

// firstString is field 1 of a message when it is a string (the id of a pod or container).
func firstString(msg []byte) string {
	for len(msg) > 0 {
		num, typ, n := protowire.ConsumeTag(msg)
		if n < 0 {
			return ""
		}
		msg = msg[n:]
		if num == 1 && typ == protowire.BytesType {
			v, _ := protowire.ConsumeBytes(msg)
			return string(v)
		}
		n = protowire.ConsumeFieldValue(num, typ, msg)
		if n < 0 {
			return ""
		}
		msg = msg[n:]
	}
	return ""
}

// serverInterceptor sees the requests plugins send to the runtime.
func (o *observer) serverInterceptor(ctx context.Context, unmarshal ttrpc.Unmarshaler, info *ttrpc.UnaryServerInfo, method ttrpc.Method) (any, error) {
	var registration *api.RegisterPluginRequest
	capture := func(v any) error {
		err := unmarshal(v)
		if req, ok := v.(*api.RegisterPluginRequest); ok && err == nil {
			registration = req
		}
		return err
	}
	resp, err := method(ctx, capture)
	if registration != nil && err == nil {
		o.mu.Lock()
		o.plugins = append(o.plugins, &pluginRecord{
			Name:         registration.PluginIdx + "-" + registration.PluginName,
			Index:        registration.PluginIdx,
			Base:         registration.PluginName,
			Generation:   o.generation,
			RegisteredAt: time.Now().UnixNano(),
		})
		o.notify()
		o.mu.Unlock()
	}
	return resp, err
}

// -- syncs and unsolicited updates -----------------------------------------------------

func (o *observer) beginSync(pods, ctrs int) *syncRecord {
	o.mu.Lock()
	defer o.mu.Unlock()
	rec := &syncRecord{Generation: o.generation, At: time.Now().UnixNano(), Pods: pods, Containers: ctrs}
	if p := o.lastPlugin(); p != nil {
		rec.Plugin = p.Name
	}
	o.syncs = append(o.syncs, rec)
	o.current = rec
	return rec
}

func (o *observer) endSync(rec *syncRecord, elapsed time.Duration, updates int, outcomes []updateOutcome, err error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	rec.Ns = elapsed.Nanoseconds()
	rec.Updates = updates
	rec.Outcomes = outcomes
	if err != nil {
		rec.Error = err.Error()
	}
	rec.Done = true
	o.current = nil
	o.notify()
}

func (o *observer) recordUnsolicited(rec *unsolicitedRecord) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.unsolicited = append(o.unsolicited, rec)
	o.notify()
}

// -- the adaptation's log --------------------------------------------------------------

// Log format strings of pkg/adaptation (the same in v0.8.0, v0.11.0 and v0.12.x).
const (
	logSynchronized = "plugin %q connected and synchronized"
	logClosed       = "connection to plugin %q closed"
	logSyncFailed   = "failed to synchronize plugin: %v"
	logDropPrefix   = "closing plugin %s, "
	logStartFailed  = "failed to start external plugin: %v"
)

// Debugf, Infof, Warnf and Errorf make the observer the adaptation's logger
// (pkg/log.Logger): every line goes to stderr, and some are noted.
func (o *observer) Debugf(ctx context.Context, format string, args ...any) {
	if o.debug {
		o.logLine("debug", format, args)
	}
}

func (o *observer) Infof(ctx context.Context, format string, args ...any) {
	o.logLine("info", format, args)
}

func (o *observer) Warnf(ctx context.Context, format string, args ...any) {
	o.logLine("warn", format, args)
}

func (o *observer) Errorf(ctx context.Context, format string, args ...any) {
	o.logLine("error", format, args)
}

func (o *observer) logLine(level, format string, args []any) {
	fmt.Fprintf(os.Stderr, "%s nri %s: %s\n", time.Now().Format("15:04:05.000000"), level, fmt.Sprintf(format, args...))
	name := func() string {
		if len(args) > 0 {
			return fmt.Sprint(args[0])
		}
		return ""
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	now := time.Now().UnixNano()
	switch {
	case format == logSynchronized:
		if p := o.plugin(name()); p != nil {
			p.Synchronized, p.SyncedAt = true, now
		}
	case format == logClosed:
		if p := o.plugin(name()); p != nil && !p.Closed {
			p.Closed, p.ClosedAt = true, now
		}
	case format == logStartFailed:
		r := refusal{At: now, Error: fmt.Sprint(args...)}
		// A plugin that registered is the newest record, still unsynchronized.
		if p := o.lastPlugin(); p != nil && !p.Synchronized && p.Generation == o.generation && p.Dropped == "" {
			r.Plugin = p.Name
			p.Dropped = "start failed: " + r.Error
		}
		o.refusals = append(o.refusals, r)
	case format == logSyncFailed:
		if p := o.lastPlugin(); p != nil {
			p.Dropped = "synchronization failed: " + fmt.Sprint(args...)
		}
	case len(format) > len(logDropPrefix) && format[:len(logDropPrefix)] == logDropPrefix:
		if p := o.plugin(name()); p != nil {
			p.Dropped = fmt.Sprintf(format, args...)
		}
	default:
		return
	}
	o.notify()
}

// logf is the harness's own log line.
func logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "%s nri-runtime: %s\n", time.Now().Format("15:04:05.000000"), fmt.Sprintf(format, args...))
}
