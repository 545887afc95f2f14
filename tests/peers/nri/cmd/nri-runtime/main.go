// Command nri-runtime runs the runtime side of NRI, github.com/containerd/nri/pkg/adaptation,
// as containerd's CRI plugin embeds it, so that tests can drive an NRI plugin exactly as
// containerd would, without containerd, runc, cgroups or a kubelet.
//
// Around the adaptation it keeps a model of the runtime's stores (pods, and containers
// with their OCI spec), which it offers to plugins in Synchronize and changes the way
// containerd does: CreateContainer adjustments go through NRI's own spec generator, and
// updates (from any response, from Synchronize, or unsolicited) are merged into the spec as
// containerd's UpdateContainerResources merges them. The model is the ground truth tests
// assert on.
//
// Which NRI it embeds is chosen at build time, with the module file (go.mod: v0.12.5;
// v0.11.0.mod, v0.8.0.mod) and a build tag (nri_v11, nri_v08) for what differs between
// the containerd releases that embed each (version_*.go).
//
// The test drives it with JSON lines on stdin and reads one JSON line per request on
// stdout (see protocol.go); logs, the adaptation's included, go to stderr.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"
)

func main() {
	var cfg config
	flag.StringVar(&cfg.socket, "socket", "", "NRI socket to listen on (required)")
	flag.StringVar(&cfg.pluginPath, "plugin-path", "", "directory of plugins to launch (default: an empty temporary directory)")
	flag.DurationVar(&cfg.registrationTimeout, "registration-timeout", 5*time.Second, "plugin registration timeout (containerd's plugin_registration_timeout)")
	flag.DurationVar(&cfg.requestTimeout, "request-timeout", 2*time.Second, "plugin request timeout (containerd's plugin_request_timeout)")
	flag.StringVar(&cfg.runtimeName, "runtime-name", "containerd", "runtime name told to plugins in Configure")
	flag.StringVar(&cfg.runtimeVersion, "runtime-version", defaultRuntimeVersion, "runtime version told to plugins in Configure")
	flag.StringVar(&cfg.onlineCPUs, "online-cpus", "", "CPUs the node has online, e.g. 0-15: running containers cannot be given others (default: no check)")
	flag.StringVar(&cfg.onlineMems, "online-mems", "", "memory nodes online, e.g. 0-1 (default: no check)")
	flag.BoolVar(&cfg.debug, "debug", true, "log the adaptation's debug messages (sync chunks among them)")
	flag.Parse()

	if err := run(cfg, os.Stdin, os.Stdout); err != nil {
		fmt.Fprintf(os.Stderr, "nri-runtime: %v\n", err)
		os.Exit(1)
	}
}

func run(cfg config, in io.Reader, out io.Writer) error {
	if cfg.socket == "" {
		return fmt.Errorf("--socket is required")
	}
	if len(cfg.socket) >= 108 {
		return fmt.Errorf("--socket %q is %d bytes; Unix socket paths must stay under 108", cfg.socket, len(cfg.socket))
	}
	if !strings.HasPrefix(nriVersion(), nriLine+".") {
		return fmt.Errorf("built for NRI %s but linked with %s: build with the matching module file and tag", nriLine, nriVersion())
	}
	if cfg.pluginPath == "" {
		dir, err := os.MkdirTemp("", "nri-plugins-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(dir)
		cfg.pluginPath = dir
	}

	h, err := newHarness(cfg)
	if err != nil {
		return err
	}
	if err := h.startAdaptation(); err != nil {
		return err
	}
	logf("NRI %s (ttrpc %s) as %s %s, %s", nriVersion(), moduleVersion("github.com/containerd/ttrpc"), cfg.runtimeName, cfg.runtimeVersion, containerdLine)

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	err = serve(ctx, h, in, out)
	h.life.Lock()
	h.nri.Stop()
	h.life.Unlock()
	return err
}

// serve answers requests until stdin closes, "stop" arrives or the context ends. Each
// request runs in its own goroutine (CRI calls to containerd are concurrent too).
func serve(ctx context.Context, h *harness, in io.Reader, out io.Writer) error {
	var (
		writeMu sync.Mutex
		running sync.WaitGroup
	)
	enc := json.NewEncoder(out)
	answer := func(v any) {
		writeMu.Lock()
		defer writeMu.Unlock()
		if err := enc.Encode(v); err != nil {
			logf("cannot write answer: %v", err)
		}
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()

	lines := make(chan []byte)
	readErr := make(chan error, 1)
	go func() {
		scanner := bufio.NewScanner(in)
		scanner.Buffer(make([]byte, 1<<20), 1<<30)
		for scanner.Scan() {
			lines <- append([]byte(nil), scanner.Bytes()...)
		}
		readErr <- scanner.Err()
	}()

	for {
		select {
		case <-ctx.Done():
			running.Wait()
			return nil
		case err := <-readErr:
			cancel()
			running.Wait()
			return err
		case line := <-lines:
			if len(strings.TrimSpace(string(line))) == 0 {
				continue
			}
			var req request
			if err := json.Unmarshal(line, &req); err != nil {
				answer(map[string]any{"id": nil, "ok": false, "error": "bad request: " + err.Error()})
				continue
			}
			if req.Op == "stop" {
				cancel()
				running.Wait()
				answer(map[string]any{"id": req.ID, "ok": true})
				return nil
			}
			running.Add(1)
			go func() {
				defer running.Done()
				answer(h.handle(ctx, req))
			}()
		}
	}
}
