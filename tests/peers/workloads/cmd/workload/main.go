// Command workload is the test node's probe container: it reports what a container sees of
// the CPUs and memory nodes it may use.
//
// At start it writes one JSON line to stdout (the container's log): Cpus_allowed_list and
// Mems_allowed_list of its own /proc/self/status, the cpuset of its cgroup as the container
// sees it, and its environment variables whose names start with one of the prefixes in
// WORKLOAD_ENV_PREFIXES (comma-separated, default DRA_), which is where CDI edits put what a
// DRA driver gave the container. With WORKLOAD_REPORT_INTERVAL set (a Go duration such as
// "2s"), it reports again at that interval, so a test can watch a running container being
// re-pinned. Each report also holds the device metadata files DRA drivers mounted into the
// container (KEP-5304, under /var/run/kubernetes.io/dra-device-attributes), by path. With
// WORKLOAD_HUGEPAGES set (byte counts, comma-separated), the start report says whether each
// amount of huge pages could be mapped and touched (see hugepages.go). It sleeps until
// SIGTERM or SIGINT and then exits 0.
//
// `workload noise SECONDS` (run in a running container, e.g. by ctr task exec) is the noise
// probe instead: see noise.go.
package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"os/signal"
	"path"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"
)

// report is one JSON line of output. Field names are what the Python side reads.
type report struct {
	Event           string            `json:"event"`
	Seq             int               `json:"seq"`
	Time            string            `json:"time"`
	PID             int               `json:"pid"`
	CpusAllowedList string            `json:"cpus_allowed_list"`
	MemsAllowedList string            `json:"mems_allowed_list"`
	Cgroup          cpusetCgroup      `json:"cgroup"`
	Env             map[string]string `json:"env"`
	DeviceMetadata  map[string]string `json:"device_metadata"`
	HugePages       map[string]string `json:"hugepages,omitempty"`
	Errors          []string          `json:"errors,omitempty"`
}

// cpusetCgroup is the container's cpuset cgroup as seen from inside the container.
type cpusetCgroup struct {
	Version       int    `json:"version"`
	Path          string `json:"path"`
	Dir           string `json:"dir"`
	Cpus          string `json:"cpus"`
	Mems          string `json:"mems"`
	EffectiveCpus string `json:"effective_cpus"`
	EffectiveMems string `json:"effective_mems"`
}

func main() {
	if len(os.Args) > 1 && os.Args[1] == "noise" {
		if err := noise(os.Args[2:]); err != nil {
			fmt.Fprintln(os.Stderr, "workload:", err)
			os.Exit(2)
		}
		return
	}
	interval, err := reportInterval()
	if err != nil {
		fmt.Fprintln(os.Stderr, "workload:", err)
		os.Exit(2)
	}
	prefixes := envPrefixes()
	signals := make(chan os.Signal, 2)
	signal.Notify(signals, syscall.SIGTERM, syscall.SIGINT)

	out := json.NewEncoder(os.Stdout)
	seq := 0
	hugePages := hugePageTrials()
	emit := func(event string) {
		seq++
		r := observe(event, seq, prefixes)
		r.HugePages = hugePages
		if err := out.Encode(r); err != nil {
			fmt.Fprintln(os.Stderr, "workload: write report:", err)
		}
	}
	emit("start")

	var tick <-chan time.Time
	if interval > 0 {
		ticker := time.NewTicker(interval)
		defer ticker.Stop()
		tick = ticker.C
	}
	for {
		select {
		case <-tick:
			emit("report")
		case <-signals:
			emit("stop")
			return
		}
	}
}

func reportInterval() (time.Duration, error) {
	value := strings.TrimSpace(os.Getenv("WORKLOAD_REPORT_INTERVAL"))
	if value == "" {
		return 0, nil
	}
	interval, err := time.ParseDuration(value)
	if err != nil {
		return 0, fmt.Errorf("WORKLOAD_REPORT_INTERVAL=%q: %w", value, err)
	}
	return interval, nil
}

func envPrefixes() []string {
	value, set := os.LookupEnv("WORKLOAD_ENV_PREFIXES")
	if !set {
		return []string{"DRA_"}
	}
	var prefixes []string
	for _, p := range strings.Split(value, ",") {
		if p = strings.TrimSpace(p); p != "" {
			prefixes = append(prefixes, p)
		}
	}
	return prefixes
}

// observe gathers one report. What cannot be read is named in Errors rather than ending the
// program: a test learns more from a partial report than from a crashed container.
func observe(event string, seq int, prefixes []string) report {
	r := report{
		Event: event,
		Seq:   seq,
		Time:  time.Now().UTC().Format(time.RFC3339Nano),
		PID:   os.Getpid(),
		Env:   map[string]string{},
	}
	fail := func(err error) { r.Errors = append(r.Errors, err.Error()) }

	status, err := statusFields("/proc/self/status", "Cpus_allowed_list", "Mems_allowed_list")
	if err != nil {
		fail(err)
	}
	r.CpusAllowedList = status["Cpus_allowed_list"]
	r.MemsAllowedList = status["Mems_allowed_list"]

	cg, err := findCpusetCgroup()
	if err != nil {
		fail(err)
	} else {
		r.Cgroup = cg
		names := [4]string{"cpuset.cpus", "cpuset.mems", "cpuset.effective_cpus", "cpuset.effective_mems"}
		if cg.Version == 2 {
			names = [4]string{"cpuset.cpus", "cpuset.mems", "cpuset.cpus.effective", "cpuset.mems.effective"}
		}
		fields := [4]*string{&r.Cgroup.Cpus, &r.Cgroup.Mems, &r.Cgroup.EffectiveCpus, &r.Cgroup.EffectiveMems}
		for i, name := range names {
			data, err := os.ReadFile(filepath.Join(cg.Dir, name))
			if err != nil {
				fail(err)
				continue
			}
			*fields[i] = strings.TrimSpace(string(data))
		}
	}

	r.DeviceMetadata, err = deviceMetadata(deviceMetadataDir)
	if err != nil {
		fail(err)
	}

	environ := os.Environ()
	sort.Strings(environ)
	for _, kv := range environ {
		name, value, _ := strings.Cut(kv, "=")
		for _, p := range prefixes {
			if strings.HasPrefix(name, p) {
				r.Env[name] = value
				break
			}
		}
	}
	return r
}

// deviceMetadataDir is where drivers mount the device metadata files of a container's claims.
const deviceMetadataDir = "/var/run/kubernetes.io/dra-device-attributes"

// deviceMetadata returns the content of every file under dir, by path; none if dir is absent.
func deviceMetadata(dir string) (map[string]string, error) {
	found := map[string]string{}
	err := filepath.WalkDir(dir, func(file string, entry os.DirEntry, err error) error {
		if err != nil {
			if file == dir && os.IsNotExist(err) {
				return filepath.SkipDir
			}
			return err
		}
		if entry.IsDir() {
			return nil
		}
		data, err := os.ReadFile(file)
		if err != nil {
			return err
		}
		found[file] = string(data)
		return nil
	})
	return found, err
}

// statusFields returns the named "Key:\tvalue" fields of a /proc/<pid>/status file.
func statusFields(file string, keys ...string) (map[string]string, error) {
	f, err := os.Open(file)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	wanted := map[string]bool{}
	for _, k := range keys {
		wanted[k] = true
	}
	found := map[string]string{}
	scanner := bufio.NewScanner(f)
	for scanner.Scan() {
		key, value, ok := strings.Cut(scanner.Text(), ":")
		if ok && wanted[key] {
			found[key] = strings.TrimSpace(value)
		}
	}
	if err := scanner.Err(); err != nil {
		return nil, err
	}
	for _, k := range keys {
		if _, ok := found[k]; !ok {
			return found, fmt.Errorf("%s has no %s", file, k)
		}
	}
	return found, nil
}

// findCpusetCgroup locates this process's cpuset cgroup directory inside the container: its
// path from /proc/self/cgroup (the cpuset hierarchy of cgroup v1, else the unified one),
// placed under the mount of that hierarchy found in /proc/self/mountinfo. Runtimes mount a
// container's own cgroup as the root of that mount, so the path is trimmed by the mount's root.
func findCpusetCgroup() (cpusetCgroup, error) {
	data, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return cpusetCgroup{}, err
	}
	var v1Path, v2Path string
	haveV1, haveV2 := false, false
	for _, line := range strings.Split(strings.TrimSpace(string(data)), "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 {
			continue
		}
		if parts[0] == "0" && parts[1] == "" {
			v2Path, haveV2 = parts[2], true
			continue
		}
		for _, controller := range strings.Split(parts[1], ",") {
			if controller == "cpuset" {
				v1Path, haveV1 = parts[2], true
			}
		}
	}
	version, cgPath := 1, v1Path
	if !haveV1 {
		if !haveV2 {
			return cpusetCgroup{}, fmt.Errorf("/proc/self/cgroup names no cpuset cgroup: %q", data)
		}
		version, cgPath = 2, v2Path
	}
	root, mountPoint, err := cgroupMount(version)
	if err != nil {
		return cpusetCgroup{Version: version, Path: cgPath}, err
	}
	rel := "/"
	if root == "/" {
		rel = cgPath
	} else if cgPath == root || strings.HasPrefix(cgPath, root+"/") {
		rel = strings.TrimPrefix(cgPath, root)
	}
	return cpusetCgroup{Version: version, Path: cgPath, Dir: path.Join(mountPoint, rel)}, nil
}

// cgroupMount finds the mount of the cpuset hierarchy (v1) or of the unified hierarchy (v2):
// the mount's root within the hierarchy and where it is mounted.
func cgroupMount(version int) (root, mountPoint string, err error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return "", "", err
	}
	defer f.Close()
	scanner := bufio.NewScanner(f)
	for scanner.Scan() {
		// ID parent major:minor root mount-point options [optional...] - fstype source super-options
		before, after, ok := strings.Cut(scanner.Text(), " - ")
		if !ok {
			continue
		}
		fields, tail := strings.Fields(before), strings.Fields(after)
		if len(fields) < 5 || len(tail) < 3 {
			continue
		}
		switch {
		case version == 1 && tail[0] == "cgroup" && hasOption(tail[2], "cpuset"):
			return fields[3], fields[4], nil
		case version == 2 && tail[0] == "cgroup2":
			return fields[3], fields[4], nil
		}
	}
	if err := scanner.Err(); err != nil {
		return "", "", err
	}
	return "", "", fmt.Errorf("no cgroup v%d mount with the cpuset controller in /proc/self/mountinfo", version)
}

func hasOption(options, name string) bool {
	for _, o := range strings.Split(options, ",") {
		if o == name {
			return true
		}
	}
	return false
}
