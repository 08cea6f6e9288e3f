//! The `sample-adapter` build.

// wit-bindgen's generated lowering code takes many arguments.
#![allow(clippy::too_many_arguments)]

use crate::faults;

#[cfg(not(any(
    feature = "wit-v0-1",
    feature = "wit-v0-2",
    feature = "wit-v0-3",
    feature = "wit-v0-4",
    feature = "wit-v0-5"
)))]
wit_bindgen::generate!({
    path: "../../../wit",
    world: "sample-adapter",
});

// The frozen 0.5 contract: a plugin built before 0.6 (faulty-v0.5.wasm).
#[cfg(feature = "wit-v0-5")]
wit_bindgen::generate!({
    path: "../../../wit/v0.5",
    world: "sample-adapter",
});

// The frozen 0.4 contract: a plugin built before 0.5 (faulty-v0.4.wasm).
#[cfg(feature = "wit-v0-4")]
wit_bindgen::generate!({
    path: "../../../wit/v0.4",
    world: "sample-adapter",
});

// The frozen 0.3 contract: a plugin built before 0.4 (faulty-v0.3.wasm).
#[cfg(feature = "wit-v0-3")]
wit_bindgen::generate!({
    path: "../../../wit/v0.3",
    world: "sample-adapter",
});

// The frozen 0.2 contract: a plugin built before 0.3 (faulty-v0.2.wasm).
#[cfg(feature = "wit-v0-2")]
wit_bindgen::generate!({
    path: "../../../wit/v0.2",
    world: "sample-adapter",
});

// The frozen 0.1 contract: a plugin built before 0.2 (faulty-v0.1.wasm).
#[cfg(feature = "wit-v0-1")]
wit_bindgen::generate!({
    path: "../../../wit/v0.1",
    world: "sample-adapter",
});

use agl::adapter::types::{BreakKind, ChainBreak, ModelCall, Span};
use agl::adapter::{config, log, tokenizer};

struct Faulty;

impl Guest for Faulty {
    fn describe() -> PluginInfo {
        PluginInfo {
            name: "faulty".to_string(),
            version: env!("CARGO_PKG_VERSION").to_string(),
            description: "test plugin that misbehaves on demand".to_string(),
        }
    }

    fn build_samples(rollout: Rollout) -> Result<Vec<Sample>, String> {
        let fault = faults::choose(&rollout.input_json, &config::get())?;
        match fault.as_str() {
            "none" => Ok(rollout.calls.iter().map(whole_response).collect()),
            "loop" => faults::spin(),
            "memory" => faults::exhaust_memory(),
            "panic" => faults::deliberate_panic(),
            "stack" => Err(format!(
                "unreachable: {}",
                faults::overflow_stack(0, far(&rollout))
            )),
            "shadow-stack" => Err(format!("unreachable: {}", faults::overflow_shadow_stack(0))),
            "malformed" => Ok(rollout.calls.iter().map(span_past_end).collect()),
            "error" => Err("faulty plugin: deliberate error".to_string()),
            "fs" => faults::probe_fs().map(|leak| vec![leaked(&rollout, leak)]),
            "net" => {
                faults::probe_net(&rollout.input_json).map(|leak| vec![leaked(&rollout, leak)])
            }
            "env" => Err(faults::env_listing()),
            "clock" => Err(faults::clock_reading()),
            "imports" => Err(probe_imports()),
            #[cfg(not(feature = "wit-v0-1"))]
            "links" => Ok(rollout.calls.iter().map(linked).collect()),
            #[cfg(not(any(feature = "wit-v0-1", feature = "wit-v0-2")))]
            "choices" => Ok(rollout.calls.iter().map(chosen).collect()),
            #[cfg(not(any(feature = "wit-v0-1", feature = "wit-v0-2", feature = "wit-v0-3")))]
            "versions" => Ok(rollout.calls.iter().map(versioned).collect()),
            #[cfg(not(any(
                feature = "wit-v0-1",
                feature = "wit-v0-2",
                feature = "wit-v0-3",
                feature = "wit-v0-4"
            )))]
            "prompts" => Ok(rollout.calls.iter().map(prompted).collect()),
            #[cfg(not(any(
                feature = "wit-v0-1",
                feature = "wit-v0-2",
                feature = "wit-v0-3",
                feature = "wit-v0-4",
                feature = "wit-v0-5"
            )))]
            "merged" => merged(),
            other => Err(format!("unknown fault {other:?}")),
        }
    }
}

/// The host's merge (0.6), each break's detail followed by the call whose
/// chain it broke.
#[cfg(not(any(
    feature = "wit-v0-1",
    feature = "wit-v0-2",
    feature = "wit-v0-3",
    feature = "wit-v0-4",
    feature = "wit-v0-5"
)))]
fn merged() -> Result<Vec<Sample>, String> {
    use agl::adapter::samples;
    let options = samples::MergeOptions {
        chain_by_agent: true,
        skip_empty_responses: true,
        summary_markers: Vec::new(),
    };
    let merged = samples::merge(&options)?;
    Ok(merged
        .into_iter()
        .map(|m| {
            let mut sample = m.sample;
            if let Some(b) = sample.break_before.as_mut() {
                b.detail = format!("{} | after={:?}", b.detail, m.after);
            }
            sample
        })
        .collect())
}

/// One sample per call whose whole response is trainable.
fn whole_response(call: &ModelCall) -> Sample {
    let len = call.response_ids.len() as u32;
    Sample {
        prompt_ids: whole_prompt(call),
        response_ids: call.response_ids.clone(),
        trainable: vec![Span { start: 0, end: len }],
        logprobs: call.response_logprobs.clone(),
        source_calls: vec![call.index],
        weight_version: call.weight_version,
        agent: None,
        break_before: None,
    }
}

/// A sample per call whose break says what the call continues: `summary`
/// with `continues=N`, or `sub-agent` for a fresh chain (0.2 only: the
/// field and both kinds are new in 0.2).
#[cfg(not(feature = "wit-v0-1"))]
fn linked(call: &ModelCall) -> Sample {
    let mut sample = whole_response(call);
    sample.break_before = Some(ChainBreak {
        kind: match call.continues {
            Some(_) => BreakKind::Summary,
            None => BreakKind::SubAgent,
        },
        call_index: call.index,
        detail: format!("continues={:?}", call.continues),
    });
    sample
}

/// A sample per call whose break detail shows the fields new in 0.3:
/// which choice of an `n` > 1 request the call is, and `constrained`.
#[cfg(not(any(feature = "wit-v0-1", feature = "wit-v0-2")))]
fn chosen(call: &ModelCall) -> Sample {
    let mut sample = whole_response(call);
    sample.break_before = Some(ChainBreak {
        kind: BreakKind::Other,
        call_index: call.index,
        detail: format!(
            "choice={:?} constrained={}",
            call.choice.map(|c| (c.index, c.count)),
            call.constrained
        ),
    });
    sample
}

/// A sample per call whose break detail shows the field new in 0.4: the
/// version that sampled each token.
#[cfg(not(any(feature = "wit-v0-1", feature = "wit-v0-2", feature = "wit-v0-3")))]
fn versioned(call: &ModelCall) -> Sample {
    let mut sample = whole_response(call);
    sample.break_before = Some(ChainBreak {
        kind: BreakKind::Other,
        call_index: call.index,
        detail: format!("versions={:?}", call.response_versions),
    });
    sample
}

/// The call's whole prompt: in the record before 0.5, from the host after.
#[cfg(any(
    feature = "wit-v0-1",
    feature = "wit-v0-2",
    feature = "wit-v0-3",
    feature = "wit-v0-4"
))]
fn whole_prompt(call: &ModelCall) -> Vec<u32> {
    call.prompt_ids.clone()
}

#[cfg(not(any(
    feature = "wit-v0-1",
    feature = "wit-v0-2",
    feature = "wit-v0-3",
    feature = "wit-v0-4"
)))]
fn whole_prompt(call: &ModelCall) -> Vec<u32> {
    agl::adapter::rollout_data::prompt_ids(call.index).unwrap_or_default()
}

/// A sample per call whose break detail shows what 0.5 hands over: the
/// prompt's link and tail length, and the lengths of the request and
/// response JSON the host serves for the call (`None` if it serves none).
#[cfg(not(any(
    feature = "wit-v0-1",
    feature = "wit-v0-2",
    feature = "wit-v0-3",
    feature = "wit-v0-4"
)))]
fn prompted(call: &ModelCall) -> Sample {
    use agl::adapter::rollout_data;
    let mut sample = whole_response(call);
    sample.break_before = Some(ChainBreak {
        kind: BreakKind::Other,
        call_index: call.index,
        detail: format!(
            "extends={:?} shared={} tail={} request={:?} response={:?} beyond={:?}",
            call.prompt.extends,
            call.prompt.shared,
            call.prompt.tail.len(),
            rollout_data::request_json(call.index).map(|j| j.len()),
            rollout_data::response_json(call.index).map(|j| j.len()),
            rollout_data::prompt_ids(u32::MAX),
        ),
    });
    sample
}

fn span_past_end(call: &ModelCall) -> Sample {
    let mut sample = whole_response(call);
    let len = sample.response_ids.len() as u32;
    sample.trainable = vec![Span {
        start: 0,
        end: len + 5,
    }];
    sample
}

/// A valid sample that carries what leaked out of the sandbox in its break
/// detail, so a test can tell a leak from a denial.
fn leaked(rollout: &Rollout, detail: String) -> Sample {
    let mut sample = rollout
        .calls
        .first()
        .map(whole_response)
        .unwrap_or_else(|| Sample {
            prompt_ids: vec![],
            response_ids: vec![0],
            trainable: vec![Span { start: 0, end: 1 }],
            logprobs: vec![0.0],
            source_calls: vec![],
            weight_version: 0,
            agent: None,
            break_before: None,
        });
    sample.break_before = Some(ChainBreak {
        kind: BreakKind::Other,
        call_index: sample.source_calls.first().copied().unwrap_or(0),
        detail,
    });
    sample
}

fn probe_imports() -> String {
    log::log(log::Level::Info, "faulty plugin: probing imports");
    format!(
        "config={} available={} vocab={:?} encode={:?}",
        config::get(),
        tokenizer::available(),
        tokenizer::vocab_size(),
        tokenizer::encode("hi", false),
    )
}

/// A recursion limit no stack can reach, unknown at compile time.
fn far(rollout: &Rollout) -> u64 {
    u64::MAX - rollout.calls.len() as u64
}

export!(Faulty);
