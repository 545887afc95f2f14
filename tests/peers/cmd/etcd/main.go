// Command etcd runs the official etcd server (go.etcd.io/etcd/server/v3) at
// the version k8s.io/kubernetes pins, so the test control plane stores its
// objects in a real etcd rather than a stand-in.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
