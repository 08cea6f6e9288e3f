//! Checks on what plugins return, so that a buggy plugin cannot hand the
//! trainer a sample it would misread.

use agl_wire::rollout::{Rollout, Sample};

/// Why one returned sample was rejected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("sample {index}: {problem}")]
pub struct InvalidSample {
    /// Position of the sample in the returned list.
    pub index: usize,
    pub problem: String,
}

/// Checks every sample against the contract in `wit/agl.wit`; the first
/// problem found is reported. `vocab_size` is checked when known.
pub fn validate_samples(
    samples: &[Sample],
    rollout: &Rollout,
    vocab_size: Option<u32>,
) -> Result<(), InvalidSample> {
    for (index, sample) in samples.iter().enumerate() {
        check(sample, rollout, vocab_size).map_err(|problem| InvalidSample { index, problem })?;
    }
    Ok(())
}

fn check(sample: &Sample, rollout: &Rollout, vocab_size: Option<u32>) -> Result<(), String> {
    let len = sample.response_ids.len();
    if len == 0 {
        return Err("empty response".to_string());
    }
    let mut previous_end = 0;
    for (i, span) in sample.trainable.iter().enumerate() {
        // Formatted only for an error: a long sample has a span per call.
        let shown = || format!("trainable span {i} [{}, {})", span.start, span.end);
        if span.start >= span.end {
            return Err(format!("{} is empty or reversed", shown()));
        }
        if span.end as usize > len {
            return Err(format!("{} ends past the response ({len} tokens)", shown()));
        }
        if i > 0 && span.start < previous_end {
            return Err(format!(
                "{} overlaps or precedes the previous span (which ends at {previous_end})",
                shown()
            ));
        }
        previous_end = span.end;
    }
    if sample.logprobs.len() != len {
        return Err(format!(
            "{} logprobs for {len} response tokens",
            sample.logprobs.len()
        ));
    }
    if !all_finite(&sample.logprobs)
        && let Some(pos) = sample.logprobs.iter().position(|lp| !lp.is_finite())
    {
        return Err(format!("logprob {pos} is {}", sample.logprobs[pos]));
    }
    if let Some(vocab) = vocab_size {
        check_ids("prompt", &sample.prompt_ids, vocab)?;
        check_ids("response", &sample.response_ids, vocab)?;
    }
    check_calls(sample, rollout)
}

/// Whether no value is infinite or NaN (exponent bits all set), in one
/// branch-free pass that vectorises: a long sample has a logprob per token.
fn all_finite(values: &[f32]) -> bool {
    const EXPONENT: u32 = 0x7f80_0000;
    let special = values.iter().fold(0u32, |any, v| {
        any | u32::from(v.to_bits() & EXPONENT == EXPONENT)
    });
    special == 0
}

fn check_ids(which: &str, ids: &[u32], vocab: u32) -> Result<(), String> {
    match ids.iter().position(|&id| id >= vocab) {
        Some(pos) => Err(format!(
            "{which} id {} at position {pos} is outside the vocabulary ({vocab} tokens)",
            ids[pos]
        )),
        None => Ok(()),
    }
}

fn check_calls(sample: &Sample, rollout: &Rollout) -> Result<(), String> {
    let known = |index: u32| rollout.calls.iter().any(|call| call.index == index);
    for (i, &call) in sample.source_calls.iter().enumerate() {
        if i > 0 && call <= sample.source_calls[i - 1] {
            return Err(format!(
                "source calls are not strictly ascending: {:?}",
                sample.source_calls
            ));
        }
        if !known(call) {
            return Err(format!(
                "source call {call} is not a call of rollout {} ({} calls)",
                rollout.id,
                rollout.calls.len()
            ));
        }
    }
    if let Some(chain_break) = &sample.break_before
        && !known(chain_break.call_index)
    {
        return Err(format!(
            "break before call {} names no call of rollout {}",
            chain_break.call_index, rollout.id
        ));
    }
    Ok(())
}

/// A reward must be a finite number (or absent).
pub fn validate_reward(reward: Option<f64>) -> Result<Option<f64>, f64> {
    match reward {
        Some(value) if !value.is_finite() => Err(value),
        other => Ok(other),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use agl_wire::rollout::{BreakKind, ChainBreak, RolloutStatus, Span};

    fn rollout(calls: u32) -> Rollout {
        Rollout {
            id: "r1".into(),
            group_id: "g".into(),
            attempt: 0,
            input: Default::default(),
            status: RolloutStatus::Succeeded,
            failure: None,
            calls: (0..calls)
                .map(|index| crate::test_calls::call(index, &[1, 2], &[3, 4, 5]))
                .collect(),
            events: vec![],
        }
    }

    fn sample() -> Sample {
        Sample {
            prompt_ids: vec![1, 2],
            response_ids: vec![3, 4, 5, 6],
            trainable: vec![Span { start: 0, end: 2 }, Span { start: 3, end: 4 }],
            logprobs: vec![-0.5, -0.25, 0.0, -1.0],
            source_calls: vec![0, 1],
            weight_version: 0,
            agent: None,
            break_before: None,
        }
    }

    /// The problem reported for one sample altered by `edit`.
    fn problem(edit: impl FnOnce(&mut Sample)) -> String {
        let mut bad = sample();
        edit(&mut bad);
        let err = validate_samples(&[sample(), bad], &rollout(2), Some(10)).unwrap_err();
        assert_eq!(err.index, 1, "{err}");
        err.problem
    }

    #[test]
    fn accepts_a_valid_sample() {
        assert_eq!(validate_samples(&[sample()], &rollout(2), Some(10)), Ok(()));
        assert_eq!(validate_samples(&[], &rollout(0), None), Ok(()));
    }

    #[test]
    fn rejects_an_empty_response() {
        let p = problem(|s| {
            s.response_ids.clear();
            s.logprobs.clear();
            s.trainable.clear();
        });
        assert_eq!(p, "empty response");
    }

    #[test]
    fn rejects_bad_spans() {
        assert!(problem(|s| s.trainable[1].end = 5).contains("ends past the response (4 tokens)"));
        assert!(problem(|s| s.trainable[0].end = 0).contains("empty or reversed"));
        assert!(problem(|s| s.trainable[1] = Span { start: 1, end: 3 }).contains("overlaps"));
        assert!(problem(|s| s.trainable.reverse()).contains("precedes"));
    }

    #[test]
    fn rejects_bad_logprobs() {
        assert_eq!(
            problem(|s| s.logprobs.truncate(3)),
            "3 logprobs for 4 response tokens"
        );
        assert_eq!(problem(|s| s.logprobs[2] = f32::NAN), "logprob 2 is NaN");
        assert!(problem(|s| s.logprobs[0] = f32::NEG_INFINITY).starts_with("logprob 0 is"));
    }

    #[test]
    fn rejects_ids_outside_the_vocabulary_only_when_known() {
        assert!(problem(|s| s.response_ids[3] = 10).contains("response id 10 at position 3"));
        assert!(problem(|s| s.prompt_ids[0] = 99).contains("prompt id 99"));
        let mut big = sample();
        big.response_ids[0] = 1_000_000;
        assert_eq!(validate_samples(&[big], &rollout(2), None), Ok(()));
    }

    #[test]
    fn rejects_bad_source_calls() {
        assert!(problem(|s| s.source_calls = vec![1, 0]).contains("not strictly ascending"));
        assert!(problem(|s| s.source_calls = vec![1, 1]).contains("not strictly ascending"));
        assert!(problem(|s| s.source_calls = vec![0, 2]).contains("source call 2 is not a call"));
        let p = problem(|s| {
            s.break_before = Some(ChainBreak {
                kind: BreakKind::Other,
                call_index: 7,
                detail: String::new(),
            })
        });
        assert!(p.contains("break before call 7"), "{p}");
    }

    #[test]
    fn the_finite_scan_agrees_with_is_finite() {
        let values = [
            0.0,
            -0.0,
            f32::MIN_POSITIVE,
            f32::MIN_POSITIVE / 2.0,
            f32::MAX,
            f32::MIN,
            -1.5,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
            -f32::NAN,
            f32::from_bits(0x7f80_0001),
        ];
        for v in values {
            // At every position of a longer slice, so the vector body and
            // the tail both see it.
            for at in 0..19 {
                let mut slice = vec![-0.5f32; 19];
                slice[at] = v;
                assert_eq!(all_finite(&slice), v.is_finite(), "{v} at {at}");
            }
        }
        assert!(all_finite(&[]));
    }

    #[test]
    fn rewards_must_be_finite() {
        assert_eq!(validate_reward(Some(0.5)), Ok(Some(0.5)));
        assert_eq!(validate_reward(None), Ok(None));
        assert!(validate_reward(Some(f64::NAN)).is_err());
        assert_eq!(validate_reward(Some(f64::INFINITY)), Err(f64::INFINITY));
    }
}
