//! berth-sim: a Kubernetes cluster in one process (API server, scheduler, kubelets, faults)
//! for tests, benchmarks and the no-cluster demo.
