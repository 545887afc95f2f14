// Command go-driver is a minimal DRA kubelet plugin built on the official
// helper k8s.io/dynamic-resource-allocation/kubeletplugin.
//
// It exists for two reasons: it proves that the kubelet harness and the test
// control plane work without depending on nodedra (which is written in
// parallel), and it is the reference peer that nodedra's behaviour and
// performance can be compared against. With the arguments "decode-metadata FILE"
// it reads a device metadata file as the official reader does (metadata.go); with
// "numa-attribute SYSFS FORM NODE..." it prints the official NUMA attribute (numa.go). It publishes one ResourceSlice with a
// few devices for its node, and prepares a claim by writing one transient CDI
// spec per claim, named the way the CDI library names transient specs
// (<driver>-device_<claim uid>.yaml), with one CDI device per allocation
// result of this driver (claim-<uid>-<index>, kind <driver>/device).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	metadatav1alpha1 "k8s.io/dynamic-resource-allocation/api/metadata/v1alpha1"
	metadatav1beta1 "k8s.io/dynamic-resource-allocation/api/metadata/v1beta1"
	"k8s.io/dynamic-resource-allocation/deviceattribute"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/yaml"
	cdispec "tags.cncf.io/container-device-interface/specs-go"
)

type config struct {
	kubeconfig  string
	nodeName    string
	driverName  string
	registryDir string
	pluginDir   string
	cdiDir      string
	devices     int
	nodeV1      bool
	nodeV1beta1 bool
	// For the benchmarks (bench/): the defaults keep the behaviour the tests expect.
	devicesPerSlice int
	kubeAPIQPS      float64
	kubeAPIBurst    int
	stateDir        string
	deviceMetadata  bool
	// Accelerator devices: device i lies in NUMA node numaNodes[i % len], its
	// resource.kubernetes.io/numaNode made by the official helper from sysfs.
	numaNodes string
	numaForm  string
	sysfs     string
}

func main() {
	if len(os.Args) == 3 && os.Args[1] == "decode-metadata" {
		if err := decodeMetadata(os.Args[2]); err != nil {
			fmt.Fprintf(os.Stderr, "go-driver: %v\n", err)
			os.Exit(1)
		}
		return
	}
	if len(os.Args) >= 4 && os.Args[1] == "numa-attribute" {
		if err := printNUMAAttributes(os.Args[2], os.Args[3], os.Args[4:]); err != nil {
			fmt.Fprintf(os.Stderr, "go-driver: %v\n", err)
			os.Exit(1)
		}
		return
	}
	klog.InitFlags(nil)
	var cfg config
	flag.StringVar(&cfg.kubeconfig, "kubeconfig", "", "kubeconfig of the API server (empty: the pod's own, in a cluster)")
	flag.StringVar(&cfg.nodeName, "node-name", "", "name of the node this plugin serves (required)")
	flag.StringVar(&cfg.driverName, "driver-name", "go.nodedra.test", "DRA driver name")
	flag.StringVar(&cfg.registryDir, "registry-dir", "", "kubelet plugin registry directory (required)")
	flag.StringVar(&cfg.pluginDir, "plugin-dir", "", "directory for the DRA service socket (required)")
	flag.StringVar(&cfg.cdiDir, "cdi-dir", "/var/run/cdi", "directory for the transient CDI specs")
	flag.IntVar(&cfg.devices, "devices", 4, "number of devices to publish")
	flag.BoolVar(&cfg.nodeV1, "node-v1", true, "serve and advertise the v1 DRA node service")
	flag.BoolVar(&cfg.nodeV1beta1, "node-v1beta1", true, "serve and advertise the v1beta1 DRA node service")
	flag.IntVar(&cfg.devicesPerSlice, "devices-per-slice", 0, "split the devices into slices of at most this many (0: one slice; the API server allows 128)")
	flag.Float64Var(&cfg.kubeAPIQPS, "kube-api-qps", 0, "client-side QPS limit of the API client (0: client-go's default of 5, negative: no limit)")
	flag.IntVar(&cfg.kubeAPIBurst, "kube-api-burst", 0, "client-side burst of the API client (0: client-go's default of 10)")
	flag.StringVar(&cfg.stateDir, "state-dir", "", "keep a durable record of each prepared claim here, as drivers with a checkpoint do (empty: none)")
	flag.BoolVar(&cfg.deviceMetadata, "device-metadata", false, "write device metadata (KEP-5304) for each prepared claim's requests, through the helper, as nodedra always does")
	flag.StringVar(&cfg.numaNodes, "numa-nodes", "", "comma-separated NUMA nodes of the devices, in turn (empty: devices without NUMA attribute)")
	flag.StringVar(&cfg.numaForm, "numa-form", "scalar", "form of resource.kubernetes.io/numaNode: scalar or list")
	flag.StringVar(&cfg.sysfs, "sysfs", "/sys", "sysfs root the NUMA attribute is read from")
	flag.Parse()

	if err := run(cfg); err != nil {
		fmt.Fprintf(os.Stderr, "go-driver: %v\n", err)
		os.Exit(1)
	}
}

func run(cfg config) error {
	for name, value := range map[string]string{
		"--node-name": cfg.nodeName, "--registry-dir": cfg.registryDir, "--plugin-dir": cfg.pluginDir,
	} {
		if value == "" {
			return fmt.Errorf("%s is required", name)
		}
	}
	for _, dir := range []string{cfg.registryDir, cfg.pluginDir, cfg.cdiDir, cfg.stateDir} {
		if dir == "" {
			continue
		}
		if err := os.MkdirAll(dir, 0o750); err != nil {
			return err
		}
	}
	restConfig, err := clientcmd.BuildConfigFromFlags("", cfg.kubeconfig)
	if err != nil {
		return fmt.Errorf("load kubeconfig: %w", err)
	}
	restConfig.QPS = float32(cfg.kubeAPIQPS)
	restConfig.Burst = cfg.kubeAPIBurst
	client, err := kubernetes.NewForConfig(restConfig)
	if err != nil {
		return fmt.Errorf("create client: %w", err)
	}

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	logger := klog.FromContext(ctx)

	d := &driver{name: cfg.driverName, cdiDir: cfg.cdiDir, stateDir: cfg.stateDir, metadata: cfg.deviceMetadata, cancel: cancel}
	options := []kubeletplugin.Option{
		kubeletplugin.KubeClient(client),
		kubeletplugin.NodeName(cfg.nodeName),
		kubeletplugin.DriverName(cfg.driverName),
		kubeletplugin.RegistrarDirectoryPath(cfg.registryDir),
		kubeletplugin.PluginDataDirectoryPath(cfg.pluginDir),
		// Like nodedra: no health service, so the kubelet is offered
		// exactly the two DRA node services.
		kubeletplugin.HealthService(false),
		kubeletplugin.NodeV1(cfg.nodeV1),
		kubeletplugin.NodeV1beta1(cfg.nodeV1beta1),
	}
	if cfg.deviceMetadata {
		// The versions nodedra writes, newest first.
		versions := []schema.GroupVersion{metadatav1beta1.SchemeGroupVersion, metadatav1alpha1.SchemeGroupVersion}
		options = append(options, kubeletplugin.EnableDeviceMetadata(true, versions), kubeletplugin.CDIDirectory(cfg.cdiDir))
	}
	helper, err := kubeletplugin.Start(ctx, d, options...)
	if err != nil {
		return fmt.Errorf("start kubelet plugin helper: %w", err)
	}
	defer helper.Stop()

	resources, err := publishedResources(cfg)
	if err != nil {
		return err
	}
	if err := helper.PublishResources(ctx, resources); err != nil {
		return fmt.Errorf("publish resources: %w", err)
	}
	logger.Info("go-driver running", "driver", cfg.driverName, "node", cfg.nodeName)
	<-ctx.Done()
	logger.Info("go-driver stopping", "cause", context.Cause(ctx))
	if err := context.Cause(ctx); err != nil && !errors.Is(err, context.Canceled) {
		return err
	}
	return nil
}

// publishedResources describes one pool, named after the node, with
// cfg.devices plain devices dev-0 ... dev-<n-1>, in one slice or, with
// cfg.devicesPerSlice, in slices of at most that many.
func publishedResources(cfg config) (resourceslice.DriverResources, error) {
	nodes, err := parseNodes(cfg.numaNodes)
	if err != nil {
		return resourceslice.DriverResources{}, err
	}
	devices := make([]resourceapi.Device, 0, cfg.devices)
	for i := range cfg.devices {
		attributes := map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
			"index": {IntValue: ptr.To(int64(i))},
			"model": {StringValue: ptr.To("go-test-device")},
		}
		if len(nodes) > 0 {
			value, err := numaAttribute(cfg.sysfs, cfg.numaForm, nodes[i%len(nodes)])
			if err != nil {
				return resourceslice.DriverResources{}, err
			}
			attributes[deviceattribute.StandardDeviceAttributeNUMANode] = value
		}
		devices = append(devices, resourceapi.Device{Name: fmt.Sprintf("dev-%d", i), Attributes: attributes})
	}
	slices := []resourceslice.Slice{{Devices: devices}}
	if size := cfg.devicesPerSlice; size > 0 && len(devices) > size {
		slices = nil
		for start := 0; start < len(devices); start += size {
			slices = append(slices, resourceslice.Slice{Devices: devices[start:min(start+size, len(devices))]})
		}
	}
	return resourceslice.DriverResources{
		Pools: map[string]resourceslice.Pool{
			cfg.nodeName: {Slices: slices},
		},
	}, nil
}

// driver implements kubeletplugin.DRAPlugin.
type driver struct {
	name     string
	cdiDir   string
	stateDir string // "": no durable record
	metadata bool   // describe each device in the helper's device metadata files
	cancel   context.CancelCauseFunc
}

var _ kubeletplugin.DRAPlugin = &driver{}

func (d *driver) PrepareResourceClaims(ctx context.Context, claims []*resourceapi.ResourceClaim) (map[types.UID]kubeletplugin.PrepareResult, error) {
	result := make(map[types.UID]kubeletplugin.PrepareResult, len(claims))
	for _, claim := range claims {
		devices, err := d.prepareClaim(claim)
		result[claim.UID] = kubeletplugin.PrepareResult{Devices: devices, Err: err}
	}
	return result, nil
}

// prepareClaim writes the claim's CDI spec and returns one device per
// allocation result of this driver. It is idempotent: a repeated call
// rewrites the same spec and returns the same answer.
func (d *driver) prepareClaim(claim *resourceapi.ResourceClaim) ([]kubeletplugin.Device, error) {
	if claim.Status.Allocation == nil {
		return nil, fmt.Errorf("claim %s/%s is not allocated", claim.Namespace, claim.Name)
	}
	kind := d.name + "/device"
	spec := cdispec.Spec{Kind: kind}
	var devices []kubeletplugin.Device
	index := 0
	for _, res := range claim.Status.Allocation.Devices.Results {
		if res.Driver != d.name {
			continue
		}
		cdiName := fmt.Sprintf("claim-%s-%d", claim.UID, index)
		spec.Devices = append(spec.Devices, cdispec.Device{
			Name: cdiName,
			ContainerEdits: cdispec.ContainerEdits{Env: []string{
				fmt.Sprintf("GO_DRIVER_%s_%d_DEVICE=%s/%s", envSafe(string(claim.UID)), index, res.Pool, res.Device),
			}},
		})
		device := kubeletplugin.Device{
			Requests:     []string{baseRequest(res.Request)},
			PoolName:     res.Pool,
			DeviceName:   res.Device,
			CDIDeviceIDs: []string{kind + "=" + cdiName},
			ShareID:      res.ShareID,
		}
		if d.metadata {
			device.Metadata = &kubeletplugin.DeviceMetadata{Attributes: map[string]resourceapi.DeviceAttribute{
				"index": {IntValue: ptr.To(int64(index))},
				"model": {StringValue: ptr.To("go-test-device")},
			}}
		}
		devices = append(devices, device)
		index++
	}
	if len(devices) == 0 {
		return nil, nil
	}
	version, err := cdispec.MinimumRequiredVersion(&spec)
	if err != nil {
		return nil, fmt.Errorf("CDI spec version for claim %s/%s: %w", claim.Namespace, claim.Name, err)
	}
	spec.Version = version
	if err := d.record(claim, devices); err != nil {
		return nil, fmt.Errorf("record claim %s/%s: %w", claim.Namespace, claim.Name, err)
	}
	if err := writeFileAtomically(d.specPath(claim.UID), &spec); err != nil {
		return nil, fmt.Errorf("write CDI spec for claim %s/%s: %w", claim.Namespace, claim.Name, err)
	}
	return devices, nil
}

func (d *driver) UnprepareResourceClaims(ctx context.Context, claims []kubeletplugin.NamespacedObject) (map[types.UID]error, error) {
	result := make(map[types.UID]error, len(claims))
	for _, claim := range claims {
		err := d.forget(claim.UID)
		if err == nil {
			err = os.Remove(d.specPath(claim.UID))
		}
		if errors.Is(err, os.ErrNotExist) {
			err = nil // Unpreparing an unknown claim succeeds.
		}
		result[claim.UID] = err
	}
	return result, nil
}

// record makes the claim's devices durable before its CDI spec is written,
// as a driver that keeps a checkpoint does: a file per claim, fsynced and
// renamed into place, then the directory fsynced.
func (d *driver) record(claim *resourceapi.ResourceClaim, devices []kubeletplugin.Device) error {
	if d.stateDir == "" {
		return nil
	}
	data, err := yaml.Marshal(devices)
	if err != nil {
		return err
	}
	if err := writeDurably(filepath.Join(d.stateDir, string(claim.UID)), data); err != nil {
		return err
	}
	return syncDir(d.stateDir)
}

// forget removes the claim's durable record, durably.
func (d *driver) forget(uid types.UID) error {
	if d.stateDir == "" {
		return nil
	}
	if err := os.Remove(filepath.Join(d.stateDir, string(uid))); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return syncDir(d.stateDir)
}

func syncDir(dir string) error {
	f, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer f.Close()
	return f.Sync()
}

func (d *driver) HandleError(ctx context.Context, err error, msg string) {
	runtime.HandleErrorWithContext(ctx, err, msg)
	if !errors.Is(err, kubeletplugin.ErrRecoverable) {
		d.cancel(fmt.Errorf("fatal background error: %s: %w", msg, err))
	}
}

func (d *driver) WatchHealthStatus(ctx context.Context, reports chan<- kubeletplugin.DeviceHealthReport) error {
	return kubeletplugin.ErrHealthNotSupported
}

// specPath is the transient spec file name the CDI library would choose
// for vendor <driver>, class "device" and the claim UID as transient ID.
func (d *driver) specPath(uid types.UID) string {
	return filepath.Join(d.cdiDir, fmt.Sprintf("%s-device_%s.yaml", d.name, uid))
}

// baseRequest strips a "/subrequest" suffix: the kubelet matches container
// claim references against the request names of the claim.
func baseRequest(request string) string {
	base, _, _ := strings.Cut(request, "/")
	return base
}

// envSafe turns a UID into part of a POSIX environment variable name.
func envSafe(s string) string {
	return strings.ReplaceAll(s, "-", "_")
}

// writeFileAtomically replaces path with the YAML form of spec, so that a
// container runtime never reads a half-written spec.
func writeFileAtomically(path string, spec *cdispec.Spec) error {
	data, err := yaml.Marshal(spec)
	if err != nil {
		return err
	}
	return writeDurably(path, data)
}

// writeDurably replaces path with data: a temporary file, fsynced, renamed.
func writeDurably(path string, data []byte) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), ".tmp-"+filepath.Base(path))
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name()) // No-op after a successful rename.
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	if err := os.Chmod(tmp.Name(), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}
