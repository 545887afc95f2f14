module nodedra.test/peers/workloads

go 1.26.0
