//! The rollout controller: turns queued rollouts into executions.

pub mod kube;
