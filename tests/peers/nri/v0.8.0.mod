module nodedra.test/nri

go 1.26.0

require (
	github.com/containerd/nri v0.8.0
	github.com/containerd/ttrpc v1.2.7
	github.com/opencontainers/runtime-spec v1.2.1
	github.com/opencontainers/runtime-tools v0.9.1-0.20221107090550-2e043c6bd626
	google.golang.org/protobuf v1.36.10
)

require (
	github.com/containerd/log v0.1.0 // indirect
	github.com/gogo/protobuf v1.3.2 // indirect
	github.com/golang/protobuf v1.5.3 // indirect
	github.com/moby/sys/mountinfo v0.6.2 // indirect
	github.com/sirupsen/logrus v1.9.3 // indirect
	github.com/syndtr/gocapability v0.0.0-20200815063812-42c35b437635 // indirect
	golang.org/x/net v0.25.0 // indirect
	golang.org/x/sys v0.21.0 // indirect
	golang.org/x/text v0.15.0 // indirect
	google.golang.org/genproto/googleapis/rpc v0.0.0-20230731190214-cbb8c96f2d6d // indirect
	google.golang.org/grpc v1.57.1 // indirect
	k8s.io/cri-api v0.25.3 // indirect
)
