//! The controller: local processes, the Kubernetes runner against a mock API server, the reconcile loop.
//! One test binary for the crate (each links the whole dependency tree).

mod k8s;
mod kube;
#[allow(dead_code)] // each module uses a subset
mod kube_mock;
mod local;
#[allow(dead_code)]
#[path = "../../../../tests/support/process.rs"]
mod process;
#[allow(dead_code)] // each module uses a subset
mod support;
