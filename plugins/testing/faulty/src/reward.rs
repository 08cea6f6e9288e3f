//! The `reward` build.

// wit-bindgen's generated lowering code takes many arguments.
#![allow(clippy::too_many_arguments)]

use crate::faults;

wit_bindgen::generate!({
    path: "../../../wit",
    world: "reward",
});

use agl::adapter::config;

struct FaultyReward;

impl Guest for FaultyReward {
    fn describe() -> PluginInfo {
        PluginInfo {
            name: "faulty-reward".to_string(),
            version: env!("CARGO_PKG_VERSION").to_string(),
            description: "test reward plugin that misbehaves on demand".to_string(),
        }
    }

    fn reward(rollout: Rollout) -> Result<Option<f64>, String> {
        let fault = faults::choose(&rollout.input_json, &config::get())?;
        match fault.as_str() {
            "none" => Ok(Some(1.0)),
            "unscored" => Ok(None),
            "nan" => Ok(Some(f64::NAN)),
            "calls" => Ok(Some(rollout.calls.len() as f64)),
            "loop" => faults::spin(),
            "memory" => faults::exhaust_memory(),
            "panic" => faults::deliberate_panic(),
            "stack" => Err(format!(
                "unreachable: {}",
                faults::overflow_stack(0, far(&rollout))
            )),
            "shadow-stack" => Err(format!("unreachable: {}", faults::overflow_shadow_stack(0))),
            "error" => Err("faulty plugin: deliberate error".to_string()),
            // Rewards carry no detail, so a probe reports leak or denial as Err.
            "fs" => Err(faults::probe_fs().unwrap_or_else(|denied| denied)),
            "net" => Err(faults::probe_net(&rollout.input_json).unwrap_or_else(|denied| denied)),
            "env" => Err(faults::env_listing()),
            "clock" => Err(faults::clock_reading()),
            other => Err(format!("unknown fault {other:?}")),
        }
    }
}

/// A recursion limit no stack can reach, unknown at compile time.
fn far(rollout: &Rollout) -> u64 {
    u64::MAX - rollout.calls.len() as u64
}

export!(FaultyReward);
