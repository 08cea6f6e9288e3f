//! End to end: the `agl` binary (serve, controller, run, plugin, model), the embedded engine, model import.
//! One test binary for the crate (each links the whole dependency tree).

mod agl_run;
mod calc_example;
mod cli;
mod coding_clis;
mod controller_cli;
mod conversation;
mod data_parallel;
mod docs;
mod durability;
mod engine_choices;
mod engine_server;
mod eval;
mod layering;
mod manifests;
mod mini_swe;
mod model_import;
mod openapi_fuzz;
mod partial_rollouts;
#[allow(dead_code)]
#[path = "../../../../tests/support/policy.rs"]
mod policy;
#[allow(dead_code)]
#[path = "../../../../tests/support/process.rs"]
mod process;
mod python_plugins;
mod report_export;
mod run_report;
mod scaffold;
mod serve_cli;
mod serve_rendering;
#[allow(dead_code)] // each module uses a subset
mod support;
mod three_processes;
mod viewer;
