//! Built-in sample adapter `transition`: one model call is one sample, its
//! prompt the call's prompt and its whole response trainable. No config.
//! Calls with no response tokens (failed upstream) yield no sample.

use agl_plugin::{Rollout, Sample, SampleBuilder};

pub struct Transition;

impl agl_plugin::SampleAdapter for Transition {
    fn build_samples(rollout: Rollout) -> Result<Vec<Sample>, String> {
        let samples = rollout
            .calls
            .iter()
            .filter(|call| !call.response_ids.is_empty())
            .map(|call| SampleBuilder::from_call(call).build());
        Ok(samples.collect())
    }
}

agl_plugin::export_adapter!(Transition);

#[cfg(test)]
mod tests {
    use agl_plugin::testing::{CallExt, call, rollout};
    use agl_plugin::{SampleAdapter, Span};

    use super::Transition;

    #[test]
    fn each_call_becomes_one_fully_trainable_sample() {
        let r = rollout(vec![
            call(0, &[1, 2], &[3, 4])
                .logprobs(&[-0.1, -0.2])
                .agent("main")
                .weight_version(2),
            call(1, &[1, 2, 3, 4, 5], &[]),
            call(2, &[1, 2, 3, 4, 5], &[6]).logprobs(&[-0.3]),
        ]);
        let samples = Transition::build_samples(r).expect("samples");
        assert_eq!(samples.len(), 2, "the empty call 1 yields nothing");

        assert_eq!(samples[0].prompt_ids, [1, 2]);
        assert_eq!(samples[0].response_ids, [3, 4]);
        assert_eq!(samples[0].trainable, [Span { start: 0, end: 2 }]);
        assert_eq!(samples[0].logprobs, [-0.1, -0.2]);
        assert_eq!(samples[0].source_calls, [0]);
        assert_eq!(samples[0].weight_version, 2);
        assert_eq!(samples[0].agent.as_deref(), Some("main"));

        assert_eq!(samples[1].prompt_ids, [1, 2, 3, 4, 5]);
        assert_eq!(samples[1].response_ids, [6]);
        assert_eq!(samples[1].trainable, [Span { start: 0, end: 1 }]);
        assert_eq!(samples[1].source_calls, [2]);
        assert_eq!(samples[1].break_before, None);
    }
}
