// Command crio-import puts an OCI image archive into CRI-O's image store, as if the node had
// pulled it: CRI-O itself only pulls from registries, and the test node has none.
//
//	crio-import --root DIR --runroot DIR [--driver overlay] ARCHIVE NAME
//	crio-import --root DIR --runroot DIR [--driver overlay] --list
//
// ARCHIVE is an OCI image layout in a tar file holding one image; NAME the reference the
// image is stored under (e.g. nodedra.test/pause:v1). The storage options must be CRI-O's
// own (its root, runroot and storage_driver), and CRI-O must not be running, or it must be
// restarted, for its image cache to see the image at once. --list prints the names of the
// images in the store, one a line.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"

	"go.podman.io/image/v5/copy"
	"go.podman.io/image/v5/oci/archive"
	"go.podman.io/image/v5/signature"
	istorage "go.podman.io/image/v5/storage"
	"go.podman.io/storage"
	"go.podman.io/storage/pkg/reexec"
)

func main() {
	if reexec.Init() {
		return
	}
	root := flag.String("root", "", "CRI-O's storage root ([crio] root)")
	runroot := flag.String("runroot", "", "CRI-O's storage run root ([crio] runroot)")
	driver := flag.String("driver", "overlay", "CRI-O's storage driver ([crio] storage_driver)")
	list := flag.Bool("list", false, "print the names of the images in the store")
	flag.Parse()
	if *root == "" || *runroot == "" || (*list && flag.NArg() != 0) || (!*list && flag.NArg() != 2) {
		fmt.Fprintln(os.Stderr, "usage: crio-import --root DIR --runroot DIR [--driver D] (ARCHIVE NAME | --list)")
		os.Exit(2)
	}
	var err error
	if *list {
		err = listImages(*root, *runroot, *driver)
	} else {
		err = importArchive(*root, *runroot, *driver, flag.Arg(0), flag.Arg(1))
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "crio-import: %v\n", err)
		os.Exit(1)
	}
}

func openStore(root, runroot, driver string) (storage.Store, error) {
	store, err := storage.GetStore(storage.StoreOptions{
		GraphRoot:       root,
		RunRoot:         runroot,
		GraphDriverName: driver,
	})
	if err != nil {
		return nil, fmt.Errorf("opening the store at %s: %w", root, err)
	}
	return store, nil
}

func closeStore(store storage.Store, err *error) {
	if _, shutdownErr := store.Shutdown(false); *err == nil && shutdownErr != nil {
		*err = fmt.Errorf("closing the store: %w", shutdownErr)
	}
}

func listImages(root, runroot, driver string) (err error) {
	store, err := openStore(root, runroot, driver)
	if err != nil {
		return err
	}
	defer closeStore(store, &err)
	images, err := store.Images()
	if err != nil {
		return fmt.Errorf("listing the images: %w", err)
	}
	for _, image := range images {
		for _, name := range image.Names {
			fmt.Println(name)
		}
	}
	return nil
}

func importArchive(root, runroot, driver, path, name string) (err error) {
	store, err := openStore(root, runroot, driver)
	if err != nil {
		return err
	}
	defer closeStore(store, &err)
	src, err := archive.NewReference(path, "")
	if err != nil {
		return fmt.Errorf("reading %s: %w", path, err)
	}
	dest, err := istorage.Transport.ParseStoreReference(store, name)
	if err != nil {
		return fmt.Errorf("image name %q: %w", name, err)
	}
	// The archive was written by the test run itself: nothing to verify.
	policy, err := signature.NewPolicyContext(&signature.Policy{
		Default: []signature.PolicyRequirement{signature.NewPRInsecureAcceptAnything()},
	})
	if err != nil {
		return err
	}
	defer func() { _ = policy.Destroy() }()
	if _, err := copy.Image(context.Background(), policy, dest, src, &copy.Options{}); err != nil {
		return fmt.Errorf("copying %s into the store as %s: %w", path, name, err)
	}
	return nil
}
