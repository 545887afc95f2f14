package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"
	"unsafe"
)

// noiseReport is what `workload noise SECONDS` prints: how undisturbed a busy loop ran on
// the CPU it was pinned to. Start and end are CLOCK_MONOTONIC nanoseconds, the clock the
// guest's trace is read with ("mono"), so that the tests count only what ran in the window.
type noiseReport struct {
	CPU         int              `json:"cpu"`
	StartNs     int64            `json:"start_ns"`
	EndNs       int64            `json:"end_ns"`
	Iterations  int64            `json:"iterations"`
	MaxGapNs    int64            `json:"max_gap_ns"`
	GapsOver    map[string]int64 `json:"gaps_over"`
	Involuntary int64            `json:"involuntary_switches"`
	Voluntary   int64            `json:"voluntary_switches"`
	PID         int              `json:"pid"`
	TID         int              `json:"tid"`
}

// gapThresholds are the gaps counted, in nanoseconds, and their names in the report.
var (
	gapThresholds = []int64{1_000, 10_000, 100_000, 1_000_000}
	gapNames      = []string{"1us", "10us", "100us", "1ms"}
)

// noise busy-loops for the given seconds on one OS thread, reading the monotonic clock each
// iteration, and prints one JSON line: the longest gap between two iterations (time the
// thread did not run: an interrupt, another task, the kernel's own work), how many gaps
// passed each threshold, and the thread's context switches in the window.
func noise(args []string) error {
	if len(args) != 1 {
		return fmt.Errorf("usage: workload noise SECONDS")
	}
	seconds, err := strconv.ParseFloat(args[0], 64)
	if err != nil || seconds <= 0 {
		return fmt.Errorf("noise: %q is not a number of seconds", args[0])
	}
	runtime.GOMAXPROCS(1)
	runtime.LockOSThread()
	before, err := switches()
	if err != nil {
		return err
	}
	r := noiseReport{GapsOver: map[string]int64{}, PID: os.Getpid(), TID: syscall.Gettid()}
	counts := make([]int64, len(gapThresholds))
	// The loop reads Go's clock (the vDSO's, no system call); the window's ends are put on
	// CLOCK_MONOTONIC's scale from one reading of it at the start.
	startMono, err := monotonic()
	if err != nil {
		return err
	}
	start := time.Now()
	window := time.Duration(seconds * 1e9)
	last := time.Duration(0)
	for last < window {
		now := time.Since(start)
		gap := int64(now - last)
		if gap > r.MaxGapNs {
			r.MaxGapNs = gap
		}
		for i, threshold := range gapThresholds {
			if gap > threshold {
				counts[i]++
			}
		}
		last = now
		r.Iterations++
	}
	after, err := switches()
	if err != nil {
		return err
	}
	r.CPU = currentCPU()
	r.StartNs, r.EndNs = startMono, startMono+int64(last)
	r.Involuntary = after[0] - before[0]
	r.Voluntary = after[1] - before[1]
	for i, name := range gapNames {
		r.GapsOver[name] = counts[i]
	}
	return json.NewEncoder(os.Stdout).Encode(r)
}

// monotonic is CLOCK_MONOTONIC in nanoseconds, as the kernel's trace clock "mono" has it.
func monotonic() (int64, error) {
	var ts syscall.Timespec
	const clockMonotonic = 1
	_, _, errno := syscall.Syscall(
		syscall.SYS_CLOCK_GETTIME, clockMonotonic, uintptr(unsafe.Pointer(&ts)), 0,
	)
	if errno != 0 {
		return 0, fmt.Errorf("clock_gettime: %w", errno)
	}
	return ts.Nano(), nil
}

// currentCPU is the CPU the thread runs on (the last field of the thread's stat said so).
func currentCPU() int {
	data, err := os.ReadFile("/proc/thread-self/stat")
	if err != nil {
		return -1
	}
	fields := strings.Fields(string(data[strings.LastIndexByte(string(data), ')')+1:]))
	cpu, err := strconv.Atoi(fields[36])
	if err != nil {
		return -1
	}
	return cpu
}

// switches is the thread's (involuntary, voluntary) context switches so far.
func switches() ([2]int64, error) {
	var found [2]int64
	file, err := os.Open("/proc/thread-self/status")
	if err != nil {
		return found, err
	}
	defer file.Close()
	scanner := bufio.NewScanner(file)
	for scanner.Scan() {
		name, value, ok := strings.Cut(scanner.Text(), ":")
		if !ok {
			continue
		}
		n, _ := strconv.ParseInt(strings.TrimSpace(value), 10, 64)
		switch name {
		case "nonvoluntary_ctxt_switches":
			found[0] = n
		case "voluntary_ctxt_switches":
			found[1] = n
		}
	}
	return found, scanner.Err()
}
