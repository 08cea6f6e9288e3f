//! What the rollout viewer reads beyond rollouts: the run's step records
//! (`/v1/steps`) and a rollout's samples (`/v1/rollouts/{id}/samples`).

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// `GET /v1/steps`: the run's step records (its `metrics.jsonl`), oldest
/// first; empty when the gateway knows of no run or it has none yet.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct StepList {
    pub steps: Vec<crate::metrics::StepRecord>,
}

/// `GET /v1/rollouts/{id}/samples`: the rollout's current attempt as the
/// hosting process's adapter turns it into training samples, decoded with
/// the policy's tokenizer, and its reward.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct SampleList {
    pub rollout_id: String,
    /// The adapter plugin that built the samples (`name version`).
    pub adapter: String,
    /// `None`: unscored (no reward plugin answer, no `reward` event).
    pub reward: Option<f64>,
    /// Where the reward comes from: the reward plugin (`name version`),
    /// or `harness` (the rollout's own last `reward` event).
    pub reward_source: String,
    /// Why the reward plugin gave none, when it failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reward_error: Option<String>,
    /// Trainable tokens over all samples (what the trainer learns from).
    pub trained_tokens: usize,
    pub samples: Vec<SampleView>,
}

/// One sample of a [`SampleList`].
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct SampleView {
    pub index: usize,
    /// Indices of the calls merged into it.
    pub source_calls: Vec<u32>,
    pub weight_version: u64,
    pub agent: Option<String>,
    /// Why the chain before it ended (kind, call, where the ids differ).
    pub break_before: Option<crate::rollout::ChainBreak>,
    pub prompt_tokens: usize,
    /// Response tokens the model sampled (trained).
    pub trained_tokens: usize,
    /// Response tokens it did not (observations, template glue: masked).
    pub masked_tokens: usize,
    /// The prompt as the policy's tokenizer decodes it (empty without one).
    pub prompt_text: String,
    /// The response in runs of trained and masked tokens, in order.
    pub segments: Vec<Segment>,
}

/// A run of response tokens that are all trained or all masked.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Segment {
    pub trained: bool,
    pub tokens: usize,
    /// Decoded (empty without a tokenizer).
    pub text: String,
}

impl SampleView {
    /// Sample `index` of a rollout, its text decoded by `decode`.
    pub fn of(
        index: usize,
        sample: &crate::rollout::Sample,
        decode: &dyn Fn(&[u32]) -> String,
    ) -> SampleView {
        let segments: Vec<Segment> = sample
            .runs()
            .into_iter()
            .map(|(trained, range)| Segment {
                trained,
                tokens: range.len(),
                text: decode(&sample.response_ids[range]),
            })
            .collect();
        let trained_tokens = sample.trainable_tokens();
        SampleView {
            index,
            source_calls: sample.source_calls.clone(),
            weight_version: sample.weight_version,
            agent: sample.agent.clone(),
            break_before: sample.break_before.clone(),
            prompt_tokens: sample.prompt_ids.len(),
            trained_tokens,
            masked_tokens: sample.response_ids.len() - trained_tokens,
            prompt_text: decode(&sample.prompt_ids),
            segments,
        }
    }
}

#[cfg(test)]
mod sample_view_tests {
    use super::*;
    use crate::rollout::{Sample, Span};

    #[test]
    fn a_sample_splits_into_trained_and_masked_runs() {
        let sample = Sample {
            prompt_ids: vec![1, 2],
            response_ids: vec![10, 11, 20, 21, 22, 12],
            trainable: vec![Span { start: 0, end: 2 }, Span { start: 5, end: 6 }],
            logprobs: vec![0.0; 6],
            source_calls: vec![0, 1],
            weight_version: 3,
            agent: None,
            break_before: None,
        };
        let decode = |ids: &[u32]| ids.iter().map(|i| format!("<{i}>")).collect::<String>();
        let view = SampleView::of(4, &sample, &decode);
        assert_eq!(
            (
                view.index,
                view.prompt_tokens,
                view.trained_tokens,
                view.masked_tokens
            ),
            (4, 2, 3, 3)
        );
        assert_eq!(view.trained_tokens, sample.trainable_tokens());
        assert_eq!(view.prompt_text, "<1><2>");
        let runs: Vec<(bool, usize, &str)> = view
            .segments
            .iter()
            .map(|s| (s.trained, s.tokens, s.text.as_str()))
            .collect();
        assert_eq!(
            runs,
            [
                (true, 2, "<10><11>"),
                (false, 3, "<20><21><22>"),
                (true, 1, "<12>")
            ]
        );
    }
}
