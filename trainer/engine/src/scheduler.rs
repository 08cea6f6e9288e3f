//! The engine thread's loop: admit (prefill), decode, finish; weight updates
//! between steps. See the module docs in `mod.rs`.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, TryRecvError};
use std::time::{SystemTime, UNIX_EPOCH};

use tch::{Kind, Tensor};

use super::sampling::{Rng, TopLogprobs, sample};
use super::{Command, EngineConfig, EngineEvent, FinishReason, Finished, InFlight, Pending};
use crate::cache::{SequenceCache, SlotId};
use agl_model::Model;

/// A sequence holding a cache slot.
struct Active {
    pending: Pending,
    slot: SlotId,
    rng: Rng,
    response: Vec<u32>,
    logprobs: Vec<f32>,
    /// One list per sampled token; empty lists unless asked for.
    top_logprobs: Vec<TopLogprobs>,
    /// The weight version that sampled each token.
    versions: Vec<u64>,
}

struct Scheduler {
    model: Model,
    cache: SequenceCache,
    waiting: VecDeque<Pending>,
    active: Vec<Active>,
    version: Arc<AtomicU64>,
    seeds: u64,
}

pub(super) fn run(
    model: Model,
    config: EngineConfig,
    commands: Receiver<Command>,
    version: Arc<AtomicU64>,
) {
    let cache = SequenceCache::new(&model, config.max_seqs, config.max_len);
    let seeds = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    let mut s = Scheduler {
        model,
        cache,
        waiting: VecDeque::new(),
        active: Vec::new(),
        version,
        seeds,
    };
    loop {
        // Idle: block for work; busy: take whatever has arrived.
        if s.waiting.is_empty() && s.active.is_empty() {
            match commands.recv() {
                Ok(c) => s.apply(c),
                Err(_) => return,
            }
        }
        loop {
            match commands.try_recv() {
                Ok(c) => s.apply(c),
                Err(TryRecvError::Empty) => break,
                Err(TryRecvError::Disconnected) if s.is_idle() => return,
                Err(TryRecvError::Disconnected) => break,
            }
        }
        s.drop_abandoned();
        s.admit();
        s.decode();
    }
}

impl Scheduler {
    fn is_idle(&self) -> bool {
        self.waiting.is_empty() && self.active.is_empty()
    }

    fn apply(&mut self, command: Command) {
        match command {
            Command::Submit(p) => self.waiting.push_back(*p),
            Command::Update {
                tensors,
                version,
                in_flight,
                done,
            } => {
                // Running sequences would mix two policies from here on:
                // end them, unless the caller keeps them (partial rollouts).
                if in_flight == InFlight::Abort {
                    for seq in std::mem::take(&mut self.active) {
                        self.finish(seq, FinishReason::Abort);
                    }
                }
                let result = self.model.load_weights_in_place(&tensors);
                if result.is_ok() {
                    self.version.store(version, Ordering::SeqCst);
                    tracing::info!(version, "engine weights updated");
                }
                let _ = done.send(result);
            }
        }
    }

    /// Sequences whose caller dropped the receiver leave now.
    fn drop_abandoned(&mut self) {
        self.waiting.retain(|p| !p.events.is_closed());
        let (gone, keep): (Vec<_>, Vec<_>) = std::mem::take(&mut self.active)
            .into_iter()
            .partition(|a| a.pending.events.is_closed());
        self.active = keep;
        for seq in gone {
            self.finish(seq, FinishReason::Abort);
        }
    }

    /// Moves waiting requests into free slots and prefills them together.
    fn admit(&mut self) {
        let mut admitted = Vec::new();
        while self.cache.free_slots() > 0 {
            let Some(pending) = self.waiting.pop_front() else {
                break;
            };
            let Some(slot) = self.cache.allocate() else {
                self.waiting.push_front(pending);
                break;
            };
            self.seeds = self.seeds.wrapping_add(1);
            let seed = pending.request.params.seed.unwrap_or(self.seeds);
            admitted.push(Active {
                pending,
                slot,
                rng: Rng::new(seed),
                response: Vec::new(),
                logprobs: Vec::new(),
                top_logprobs: Vec::new(),
                versions: Vec::new(),
            });
        }
        if admitted.is_empty() {
            return;
        }
        let prompts: Vec<Vec<i64>> = admitted
            .iter()
            .map(|a| {
                a.pending
                    .request
                    .prompt_ids
                    .iter()
                    .map(|&t| t as i64)
                    .collect()
            })
            .collect();
        let batch: Vec<(SlotId, &[i64])> = admitted
            .iter()
            .zip(&prompts)
            .map(|(a, p)| (a.slot, p.as_slice()))
            .collect();
        self.step(admitted, &batch);
    }

    /// One decode step for every active sequence.
    fn decode(&mut self) {
        if self.active.is_empty() {
            return;
        }
        let seqs = std::mem::take(&mut self.active);
        let last: Vec<[i64; 1]> = seqs
            .iter()
            .map(|a| [a.response.last().copied().unwrap_or(0) as i64])
            .collect();
        let batch: Vec<(SlotId, &[i64])> = seqs
            .iter()
            .zip(&last)
            .map(|(a, t)| (a.slot, t.as_slice()))
            .collect();
        self.step(seqs, &batch);
    }

    /// Runs `batch` for `seqs` (same order), samples one token each, and
    /// keeps the sequences that go on.
    fn step(&mut self, mut seqs: Vec<Active>, batch: &[(SlotId, &[i64])]) {
        // Constrained sequences' masks depend only on the tokens so far:
        // computed on threads of their own while the model runs.
        let (rows, masks) = std::thread::scope(|scope| {
            let pending: Vec<_> = seqs
                .iter_mut()
                .map(|seq| {
                    let constraint = seq.pending.request.constraint.as_mut()?;
                    Some(scope.spawn(move || constraint.allowed()))
                })
                .collect();
            let rows = self.logits(batch);
            let masks: Vec<Option<Result<Vec<u32>, String>>> = pending
                .into_iter()
                .map(|h| {
                    h.map(|h| {
                        h.join()
                            .unwrap_or_else(|_| Err("the constraint panicked".into()))
                    })
                })
                .collect();
            (rows, masks)
        });
        let rows = match rows {
            Ok(rows) => rows,
            Err(e) => {
                tracing::error!("engine step failed: {e}");
                for seq in seqs {
                    self.finish(seq, FinishReason::Abort);
                }
                return;
            }
        };
        for ((mut seq, row), mask) in seqs.into_iter().zip(rows).zip(masks) {
            let mask = match mask {
                None => None,
                Some(Ok(mask)) if mask.iter().any(|w| *w != 0) => Some(mask),
                Some(outcome) => {
                    let why = outcome
                        .err()
                        .unwrap_or_else(|| "no token is allowed".into());
                    tracing::warn!("constrained decoding stopped: {why}");
                    self.finish(seq, FinishReason::ConstraintError);
                    continue;
                }
            };
            let params = &seq.pending.request.params;
            let (id, logprob, top) = sample(&row, params, mask.as_deref(), &mut seq.rng);
            let version = self.version.load(Ordering::SeqCst);
            seq.response.push(id);
            seq.logprobs.push(logprob);
            seq.top_logprobs.push(top.clone());
            seq.versions.push(version);
            let _ = seq.pending.events.send(EngineEvent::Token {
                id,
                logprob,
                top,
                version,
            });
            let complete = match seq.pending.request.constraint.as_mut() {
                Some(c) => c.commit(id),
                None => Ok(false),
            };
            let reason = match complete {
                Ok(true) => Some(FinishReason::Stop),
                Ok(false) => self.reason_to_stop(&mut seq),
                Err(why) => {
                    tracing::warn!("constrained decoding stopped: {why}");
                    Some(FinishReason::ConstraintError)
                }
            };
            match reason {
                Some(reason) => self.finish(seq, reason),
                None => self.active.push(seq),
            }
        }
    }

    /// The step's last-token logits as f32 rows.
    fn logits(&mut self, batch: &[(SlotId, &[i64])]) -> Result<Vec<Vec<f32>>, String> {
        let logits = self
            .cache
            .step(&self.model, batch)
            .map_err(|e| e.to_string())?;
        to_rows(&logits)
    }

    fn reason_to_stop(&self, seq: &mut Active) -> Option<FinishReason> {
        let request = &mut seq.pending.request;
        let id = *seq.response.last()?;
        if request.params.stop_ids.contains(&id) {
            return Some(FinishReason::Stop);
        }
        if let Some(hook) = request.stop_hook.as_mut()
            && hook(&seq.response)
        {
            return Some(FinishReason::Stop);
        }
        // The next step would feed this token: it must fit in the cache.
        let fed = request.prompt_ids.len() + seq.response.len();
        if seq.response.len() >= request.params.max_tokens || fed >= self.cache.max_len() {
            return Some(FinishReason::Length);
        }
        None
    }

    fn finish(&mut self, seq: Active, reason: FinishReason) {
        self.cache.release(seq.slot);
        let Pending { request, events } = seq.pending;
        let constrained = request.constraint.is_some();
        let _ = events.send(EngineEvent::Finished(Finished {
            finish_reason: reason,
            prompt_ids: request.prompt_ids,
            response_ids: seq.response,
            logprobs: seq.logprobs,
            top_logprobs: seq.top_logprobs,
            weight_version: self.version.load(Ordering::SeqCst),
            token_versions: seq.versions,
            constrained,
        }));
    }
}

/// `[N, V]` logits of any dtype/device -> N f32 rows.
fn to_rows(logits: &Tensor) -> Result<Vec<Vec<f32>>, String> {
    let v = logits.size().get(1).copied().unwrap_or(0) as usize;
    let flat = logits
        .to_kind(Kind::Float)
        .to_device(tch::Device::Cpu)
        .contiguous()
        .view([-1]);
    let all = Vec::<f32>::try_from(&flat).map_err(|e| e.to_string())?;
    Ok(all.chunks(v.max(1)).map(<[f32]>::to_vec).collect())
}
