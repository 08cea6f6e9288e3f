//! Building one training sample out of consecutive model calls.

use std::borrow::Cow;

use crate::call::{Call, agent};
use crate::prefix::common_prefix_len;
use crate::{ChainBreak, Sample, Span};

/// Accumulates calls into one sample: the first call's prompt is the
/// sample's prompt, its response the first trainable span; every extension
/// adds the next call's new prompt tokens (observations: tool output, user
/// turns, template glue) as masked context with log-prob 0.0, then its
/// response as the next trainable span.
///
/// The sample so far is always its last call's `prompt ++ response`, so a
/// call whose prompt is linked to that call in full ([`Call::prompt_link`])
/// continues it by its `tail` alone, without the whole prompt being
/// fetched or compared.
#[derive(Debug, Clone)]
pub struct SampleBuilder {
    sample: Sample,
    /// The index of the last call merged.
    last: u32,
}

/// A call whose prompt does not start with the sample so far.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NotAContinuation {
    /// Position in `prompt ++ response` of the sample where the call's
    /// prompt first differs (or ends).
    pub at: usize,
}

impl SampleBuilder {
    /// A sample of exactly one call, its whole response trainable.
    pub fn from_call(call: &impl Call) -> Self {
        let mut sample = Sample {
            prompt_ids: call.prompt_ids().into_owned(),
            response_ids: Vec::new(),
            trainable: Vec::new(),
            logprobs: Vec::new(),
            source_calls: Vec::new(),
            weight_version: call.weight_version(),
            agent: agent(call).map(str::to_owned),
            break_before: None,
        };
        push_response(&mut sample, call);
        SampleBuilder {
            sample,
            last: call.index(),
        }
    }

    /// Records why the previous sample ended where this one begins.
    pub fn with_break(mut self, chain_break: ChainBreak) -> Self {
        self.sample.break_before = Some(chain_break);
        self
    }

    /// Length of `prompt ++ response` so far.
    pub fn len(&self) -> usize {
        self.sample.prompt_ids.len() + self.sample.response_ids.len()
    }

    /// Never true: a sample starts from a call's prompt.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether `next`'s prompt starts with this sample's `prompt ++ response`.
    pub fn continues(&self, next: &impl Call) -> bool {
        self.observation(next).is_ok()
    }

    /// Appends `next` if it continues the sample; otherwise leaves the
    /// sample unchanged and says where the ids first differ.
    pub fn extend(&mut self, next: &impl Call) -> Result<(), NotAContinuation> {
        let observation = self.observation(next)?;
        let sample = &mut self.sample;
        sample.response_ids.extend_from_slice(&observation);
        sample.logprobs.resize(sample.response_ids.len(), 0.0);
        push_response(sample, next);
        self.last = next.index();
        Ok(())
    }

    /// The ids `next`'s prompt adds to the sample, or where it first
    /// differs from it.
    fn observation<'a, C: Call>(&self, next: &'a C) -> Result<Cow<'a, [u32]>, NotAContinuation> {
        if let Some(link) = next.prompt_link().filter(|l| l.extends == Some(self.last)) {
            if link.shared == self.len() {
                return Ok(Cow::Borrowed(link.tail));
            }
            // Linked to the same ids, so it first differs where it stops sharing.
            return Err(NotAContinuation { at: link.shared });
        }
        let whole = next.prompt_ids();
        let at = self.first_difference(&whole);
        if at < self.len() {
            return Err(NotAContinuation { at });
        }
        Ok(match whole {
            Cow::Borrowed(ids) => Cow::Borrowed(&ids[at..]),
            Cow::Owned(mut ids) => Cow::Owned(ids.split_off(at)),
        })
    }

    /// Where `prompt` first differs from `prompt ++ response` so far (the
    /// sample's length when it starts with all of it).
    fn first_difference(&self, prompt: &[u32]) -> usize {
        let own = &self.sample.prompt_ids;
        let in_prompt = common_prefix_len(own, prompt);
        if in_prompt < own.len() {
            return in_prompt;
        }
        in_prompt + common_prefix_len(&self.sample.response_ids, &prompt[own.len()..])
    }

    /// The sample built so far.
    pub fn sample(&self) -> &Sample {
        &self.sample
    }

    pub fn build(self) -> Sample {
        self.sample
    }
}

/// Appends `call`'s response as a trainable span (joined to the previous
/// span when no observation separates them) and records the call.
fn push_response(sample: &mut Sample, call: &impl Call) {
    let start = sample.response_ids.len() as u32;
    sample.response_ids.extend_from_slice(call.response_ids());
    let end = sample.response_ids.len() as u32;
    // Log-probs are one per response id; a short list (an engine bug the
    // host also rejects) is padded so positions never shift.
    let mut logprobs = call.response_logprobs().iter().copied();
    sample
        .logprobs
        .extend((start..end).map(|_| logprobs.next().unwrap_or(0.0)));
    match sample.trainable.last_mut() {
        Some(last) if last.end == start => last.end = end,
        _ if start < end => sample.trainable.push(Span { start, end }),
        _ => {}
    }
    sample.source_calls.push(call.index());
    sample.weight_version = sample.weight_version.min(call.weight_version());
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_calls::{TestCall, call};

    fn with(c: TestCall, logprobs: &[f32], weight_version: u64) -> TestCall {
        TestCall {
            logprobs: logprobs.to_vec(),
            weight_version,
            ..c
        }
    }

    #[test]
    fn one_call_is_one_trainable_span() {
        let c = with(call(3, &[1, 2], &[10, 11]), &[-0.5, -0.25], 7);
        let s = SampleBuilder::from_call(&c).build();
        assert_eq!(s.prompt_ids, [1, 2]);
        assert_eq!(s.response_ids, [10, 11]);
        assert_eq!(s.trainable, [Span { start: 0, end: 2 }]);
        assert_eq!(s.logprobs, [-0.5, -0.25]);
        assert_eq!(s.source_calls, [3]);
        assert_eq!(s.weight_version, 7);
    }

    #[test]
    fn extend_masks_observation_and_keeps_the_oldest_weight_version() {
        let first = with(call(0, &[1, 2], &[10, 11]), &[-0.5, -0.25], 4);
        let second = with(call(1, &[1, 2, 10, 11, 20, 21], &[30]), &[-1.0], 3);
        let mut b = SampleBuilder::from_call(&first);
        assert_eq!(b.extend(&second), Ok(()));
        let s = b.build();
        assert_eq!(s.response_ids, [10, 11, 20, 21, 30]);
        assert_eq!(
            s.trainable,
            [Span { start: 0, end: 2 }, Span { start: 4, end: 5 }]
        );
        assert_eq!(s.logprobs, [-0.5, -0.25, 0.0, 0.0, -1.0]);
        assert_eq!(s.source_calls, [0, 1]);
        assert_eq!(s.weight_version, 3);
    }

    #[test]
    fn a_continuation_without_observation_joins_the_spans() {
        let first = call(0, &[1], &[10]);
        let second = call(1, &[1, 10], &[11]);
        let mut b = SampleBuilder::from_call(&first);
        assert_eq!(b.extend(&second), Ok(()));
        assert_eq!(b.sample().trainable, [Span { start: 0, end: 2 }]);
    }

    #[test]
    fn extend_refuses_a_prompt_that_does_not_continue_and_says_where() {
        let first = call(0, &[1, 2], &[10, 11]);
        let mut b = SampleBuilder::from_call(&first);
        assert_eq!(
            b.extend(&call(1, &[1, 2, 10, 99, 5], &[6])),
            Err(NotAContinuation { at: 3 })
        );
        assert_eq!(
            b.extend(&call(1, &[1, 7], &[6])),
            Err(NotAContinuation { at: 1 })
        );
        assert_eq!(
            b.extend(&call(1, &[1, 2, 10], &[6])),
            Err(NotAContinuation { at: 3 })
        );
        assert_eq!(
            b.sample().source_calls,
            [0],
            "a refused call leaves the sample unchanged"
        );
    }
}
