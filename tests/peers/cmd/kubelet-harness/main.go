// Command kubelet-harness runs the kubelet's own DRA code outside a kubelet,
// so that tests can drive a DRA kubelet plugin exactly as a kubelet would
// without a container runtime, cgroups or root-only node setup.
//
// It wires together, as pkg/kubelet does:
//   - the plugin manager (pkg/kubelet/pluginmanager) watching a registry
//     directory, with the DRA manager's watcher handler registered for plugin
//     type DRAPlugin, so registration runs through the kubelet's operation
//     executor (GetInfo, service selection, NotifyRegistrationStatus);
//   - the DRA manager (pkg/kubelet/cm/dra) with its checkpoint in a state
//     directory, whose PrepareResources/UnprepareResources/GetResources are
//     called for real Pod objects read from the API server.
//
// The test drives it with JSON lines on stdin and reads one JSON line per
// request on stdout (see protocol.go); logs go to stderr.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"sync"
	"syscall"

	v1 "k8s.io/api/core/v1"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
	"k8s.io/kubernetes/pkg/kubelet/cm/dra"
	"k8s.io/kubernetes/pkg/kubelet/pluginmanager"
)

type config struct {
	kubeconfig   string
	nodeName     string
	registryDir  string
	stateDir     string
	featureGates string
}

func main() {
	klog.InitFlags(nil)
	var cfg config
	flag.StringVar(&cfg.kubeconfig, "kubeconfig", "", "kubeconfig with the kubelet's credentials (required)")
	flag.StringVar(&cfg.nodeName, "node-name", "", "name of the node this kubelet stands for (required)")
	flag.StringVar(&cfg.registryDir, "registry-dir", "", "plugin registration directory to watch, like /var/lib/kubelet/plugins_registry (required)")
	flag.StringVar(&cfg.stateDir, "state-dir", "", "directory for the DRA manager's checkpoint, like /var/lib/kubelet (required)")
	flag.StringVar(&cfg.featureGates, "feature-gates", "", "kubelet feature gates, e.g. DRAConsumableCapacity=true,...")
	flag.Parse()

	if err := run(cfg, os.Stdin, os.Stdout); err != nil {
		fmt.Fprintf(os.Stderr, "kubelet-harness: %v\n", err)
		os.Exit(1)
	}
}

func run(cfg config, in io.Reader, out io.Writer) error {
	for name, value := range map[string]string{
		"--kubeconfig": cfg.kubeconfig, "--node-name": cfg.nodeName,
		"--registry-dir": cfg.registryDir, "--state-dir": cfg.stateDir,
	} {
		if value == "" {
			return fmt.Errorf("%s is required", name)
		}
	}
	if cfg.featureGates != "" {
		if err := utilfeature.DefaultMutableFeatureGate.Set(cfg.featureGates); err != nil {
			return fmt.Errorf("--feature-gates: %w", err)
		}
	}
	for _, dir := range []string{cfg.registryDir, cfg.stateDir} {
		if err := os.MkdirAll(dir, 0o750); err != nil {
			return err
		}
	}
	restConfig, err := clientcmd.BuildConfigFromFlags("", cfg.kubeconfig)
	if err != nil {
		return fmt.Errorf("load kubeconfig: %w", err)
	}
	restConfig.UserAgent = "kubelet-harness/" + cfg.nodeName
	client, err := kubernetes.NewForConfig(restConfig)
	if err != nil {
		return fmt.Errorf("create client: %w", err)
	}

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()

	// The kubelet's DRA code logs some decisions it does not expose
	// otherwise (the chosen gRPC service, ResourceSlice wiping); the
	// observing logger records them for the test.
	obs := newObserver()
	logger := klog.Background()
	logger = logger.WithSink(newObservingSink(logger.GetSink(), obs))
	ctx = klog.NewContext(ctx, logger)

	h, err := startKubelet(ctx, cfg, client, obs)
	if err != nil {
		return err
	}
	defer h.stop()

	return serve(ctx, h, in, out)
}

// serve answers requests until stdin closes or the context ends. Each
// request runs in its own goroutine (a kubelet also prepares pods
// concurrently); responses carry the request id.
func serve(ctx context.Context, h *harness, in io.Reader, out io.Writer) error {
	var writeMu sync.Mutex
	write := func(resp map[string]any) {
		data, err := json.Marshal(resp)
		if err != nil {
			data, _ = json.Marshal(map[string]any{"id": resp["id"], "ok": false, "error": "encode response: " + err.Error()})
		}
		writeMu.Lock()
		defer writeMu.Unlock()
		_, _ = out.Write(append(data, '\n'))
	}

	lines := make(chan []byte)
	readErr := make(chan error, 1)
	go func() {
		scanner := bufio.NewScanner(in)
		scanner.Buffer(make([]byte, 64*1024), 16*1024*1024)
		for scanner.Scan() {
			lines <- append([]byte(nil), scanner.Bytes()...)
		}
		readErr <- scanner.Err()
	}()

	// When we stop serving, requests still running are canceled before we
	// wait for them (defers run last-in first-out).
	var wg sync.WaitGroup
	defer wg.Wait()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	for {
		select {
		case <-ctx.Done():
			return nil
		case err := <-readErr:
			// stdin closed: the test is done with us.
			return err
		case line := <-lines:
			var req request
			if err := json.Unmarshal(line, &req); err != nil {
				write(map[string]any{"id": nil, "ok": false, "error": "invalid request: " + err.Error()})
				continue
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				write(h.handle(ctx, req))
			}()
		}
	}
}

// startKubelet sets up the DRA manager and the plugin manager in the order
// the kubelet uses: the DRA manager is started first, because its watcher
// handler only exists after Start.
func startKubelet(ctx context.Context, cfg config, client kubernetes.Interface, obs *observer) (*harness, error) {
	logger := klog.FromContext(ctx)
	h := &harness{
		nodeName: cfg.nodeName,
		client:   client,
		obs:      obs,
		active:   map[string]*v1.Pod{},
		stopCh:   make(chan struct{}),
	}

	manager, err := dra.NewManager(logger, client, cfg.stateDir)
	if err != nil {
		return nil, fmt.Errorf("create DRA manager: %w", err)
	}
	h.manager = manager
	if err := manager.Start(ctx, h.activePods, nodeGetter(client, cfg.nodeName), sourcesReady{}); err != nil {
		return nil, fmt.Errorf("start DRA manager: %w", err)
	}

	plugins := pluginmanager.NewPluginManager(cfg.registryDir, &record.FakeRecorder{})
	plugins.AddHandler(registerapi.DRAPlugin, &observingHandler{inner: manager.GetWatcherHandler(), obs: obs})
	h.pluginsDone = make(chan struct{})
	go func() {
		defer close(h.pluginsDone)
		runPlugins(ctx, plugins, h.stopCh)
	}()
	return h, nil
}

// harness holds what the request handlers need.
type harness struct {
	nodeName    string
	client      kubernetes.Interface
	manager     *dra.Manager
	obs         *observer
	stopCh      chan struct{}
	pluginsDone chan struct{}

	// active are the pods that were handed to PrepareResources and not
	// yet unprepared, keyed by namespace/name. They are the kubelet's
	// "active pods": the DRA manager's reconcile loop unprepares claims of
	// pods that are not active.
	mu     sync.Mutex
	active map[string]*v1.Pod
}

func (h *harness) activePods() []*v1.Pod {
	h.mu.Lock()
	defer h.mu.Unlock()
	pods := make([]*v1.Pod, 0, len(h.active))
	for _, pod := range h.active {
		pods = append(pods, pod)
	}
	return pods
}

func (h *harness) stop() {
	close(h.stopCh)
	<-h.pluginsDone
	stopManager(h.manager)
}

// sourcesReady tells the kubelet components that all pod sources have been
// seen: in the harness, the test is the only pod source.
type sourcesReady struct{}

func (sourcesReady) AddSource(string) {}
func (sourcesReady) AllReady() bool   { return true }

var errTimeout = errors.New("timed out")
