//! Data-parallel updates over a libtorch c10d process group
//! ([`crate::dist::ProcessGroup`]): every rank holds the same weights and
//! the same [`UpdateBatch`], whose per-token weights were fixed before any
//! split (`w = m / (N T_i)`, ARCHITECTURE.md, Training), so the batch
//! gradient is the sum of any partition's gradients.
//!
//! [`train_step_data_parallel`]: the micro-batches of the one-process
//! packing go to ranks (largest first, each to the least loaded rank);
//! each rank runs forward + backward on its share; the gradients are
//! summed across ranks in flat buckets; the statistics' token sums too.
//! Then every rank clips the same global norm and steps the same AdamW, so
//! the weights stay equal. With ZeRO-1 ([`RlOptimizer::new_sharded`]) each
//! parameter's AdamW state lives on one rank only (its owner, chosen by
//! size): the owner updates it and broadcasts the new values, as
//! `torch.distributed.optim.ZeroRedundancyOptimizer` does.

use std::hash::Hasher;

use tch::{Device, Kind, Tensor};

use super::RlError;
use super::adamw::AdamW;
use super::batch::UpdateBatch;
use super::pack::{MicroBatch, Packing};
use super::step::{
    RlOptimizer, StepConfig, StepStats, StepSums, clip_grad_norm, pack_with_signal, run_sums,
    stats_from,
};
use crate::dist::{ProcessGroup, ReduceOp};
use crate::model::Model;

/// Gradient buckets for the all-reduce: 25 MiB of f32 each, like DDP's
/// default `bucket_cap_mb`.
const BUCKET_ELEMENTS: i64 = 25 * 1024 * 1024 / 4;

/// The micro-batches of `packing` that `rank` runs: largest first, each to
/// the rank with the fewest slots so far (ties to the lowest rank). Every
/// rank computes the same assignment from the same packing.
pub fn rank_share(packing: &Packing, rank: usize, world_size: usize) -> Packing {
    let mut order: Vec<usize> = (0..packing.micro_batches.len()).collect();
    order.sort_by_key(|&i| std::cmp::Reverse(packing.micro_batches[i].slots()));
    let mut load = vec![0usize; world_size.max(1)];
    let mut mine: Vec<MicroBatch> = Vec::new();
    for i in order {
        let mb = &packing.micro_batches[i];
        let (least, _) = load
            .iter()
            .enumerate()
            .min_by_key(|&(r, l)| (*l, r))
            .expect("world_size >= 1");
        load[least] += mb.slots();
        if least == rank {
            mine.push(mb.clone());
        }
    }
    Packing {
        micro_batches: mine,
        real_tokens: packing.real_tokens,
    }
}

/// One update on every rank of `group` (each calls it with the same batch
/// and config); returns the whole batch's statistics on every rank.
pub fn train_step_data_parallel(
    model: &Model,
    optimizer: &mut RlOptimizer,
    batch: &UpdateBatch,
    cfg: &StepConfig,
    group: &mut ProcessGroup,
) -> Result<StepStats, RlError> {
    let params: Vec<Tensor> = model
        .trainable_parameters()
        .into_iter()
        .map(|(_, t)| t)
        .collect();
    zero_grads(&params);
    let packing = pack_with_signal(model, batch, cfg);
    let share = rank_share(&packing, group.rank(), group.world_size());
    let mut sums = run_sums(model, batch, &share, cfg, true)?;
    materialise_grads(&params);
    all_reduce_grads(group, &params)?;
    all_reduce_sums(group, &mut sums)?;
    let mut stats = StepStats {
        samples: batch.samples.len(),
        skipped_samples: batch.samples.len() - packing.samples(),
        trainable_tokens: batch.samples.iter().map(|s| s.trainable_tokens()).sum(),
        micro_batches: packing.micro_batches.len(),
        padding_waste: packing.padding_waste(),
        ..stats_from(&sums, cfg)
    };
    stats.grad_norm = clip_grad_norm(&params, cfg.max_grad_norm);
    stats.lr = optimizer.schedule().lr_at(optimizer.steps());
    optimizer.step_adamw(stats.lr)?;
    if let Some(owners) = optimizer.owners() {
        broadcast_from_owners(group, &params, owners)?;
    }
    if cfg!(debug_assertions) {
        let hash = check_same_weights(group, model)?;
        tracing::info!(
            rank = group.rank(),
            weights_hash = format!("{hash:016x}"),
            "data-parallel ranks hold the same weights"
        );
    }
    Ok(stats)
}

/// Zeroes every defined gradient (whether or not an optimizer shard holds
/// the parameter).
fn zero_grads(params: &[Tensor]) {
    for p in params {
        let mut g = p.grad();
        if g.defined() {
            let _ = g.detach_();
            let _ = g.zero_();
        }
    }
}

/// A rank whose share was empty (or whose micro-batches left a parameter
/// out) has no `.grad` yet: a zero backward creates zeros, so every rank
/// contributes a tensor of the same shape to each bucket.
fn materialise_grads(params: &[Tensor]) {
    if params.iter().all(|p| p.grad().defined()) {
        return;
    }
    let zero = params
        .iter()
        .map(|p| p.sum(Kind::Float) * 0.0)
        .fold(Tensor::zeros([], (Kind::Float, Device::Cpu)), |a, b| {
            a.to_device(b.device()) + b
        });
    zero.backward();
}

/// The parameters' indices in buckets of at most [`BUCKET_ELEMENTS`] (a
/// larger parameter gets a bucket of its own), in order.
fn buckets(params: &[Tensor]) -> Vec<Vec<usize>> {
    let mut out: Vec<Vec<usize>> = Vec::new();
    let mut size = 0;
    for (i, p) in params.iter().enumerate() {
        let n = p.numel() as i64;
        if out.is_empty() || size + n > BUCKET_ELEMENTS {
            out.push(Vec::new());
            size = 0;
        }
        out.last_mut().expect("pushed").push(i);
        size += n;
    }
    out
}

/// Sums every parameter's gradient across ranks, bucket by bucket: the
/// bucket's gradients flattened into one f32 tensor, all-reduced, copied
/// back.
fn all_reduce_grads(group: &mut ProcessGroup, params: &[Tensor]) -> Result<(), RlError> {
    let device = group.device();
    for bucket in buckets(params) {
        let grads: Vec<Tensor> = bucket.iter().map(|&i| params[i].grad()).collect();
        let mut flat = tch::no_grad(|| {
            Tensor::cat(
                &grads
                    .iter()
                    .map(|g| g.to_kind(Kind::Float).reshape([-1]).to_device(device))
                    .collect::<Vec<_>>(),
                0,
            )
        });
        group.all_reduce(&mut flat, ReduceOp::Sum)?;
        let mut at = 0;
        tch::no_grad(|| {
            for mut g in grads {
                let n = g.numel() as i64;
                let part = flat.narrow(0, at, n).view_as(&g).to_device(g.device());
                g.copy_(&part.to_kind(g.kind()));
                at += n;
            }
        });
    }
    Ok(())
}

/// Adds the statistics' token sums across ranks (the gap's max by max).
fn all_reduce_sums(group: &mut ProcessGroup, sums: &mut StepSums) -> Result<(), RlError> {
    let device = group.device();
    let mut t = Tensor::from_slice(&sums.sums()).to_device(device);
    group.all_reduce(&mut t, ReduceOp::Sum)?;
    let v = Vec::<f64>::try_from(&t.to_device(Device::Cpu))?;
    let mut out = [0.0; 14];
    out.copy_from_slice(&v);
    sums.set_sums(out);
    let mut max = Tensor::from_slice(&[sums.mismatch.abs_gap_max]).to_device(device);
    group.all_reduce(&mut max, ReduceOp::Max)?;
    sums.mismatch.abs_gap_max = f64::try_from(&max.to_device(Device::Cpu))?;
    Ok(())
}

/// ZeRO-1: each parameter's new value from the rank that updated it,
/// flattened per owner.
fn broadcast_from_owners(
    group: &mut ProcessGroup,
    params: &[Tensor],
    owners: &[usize],
) -> Result<(), RlError> {
    let device = group.device();
    for owner in 0..group.world_size() {
        let mine: Vec<&Tensor> = params
            .iter()
            .zip(owners)
            .filter(|&(_, &o)| o == owner)
            .map(|(p, _)| p)
            .collect();
        if mine.is_empty() {
            continue;
        }
        let mut flat = tch::no_grad(|| {
            Tensor::cat(
                &mine
                    .iter()
                    .map(|p| {
                        p.detach()
                            .to_kind(Kind::Float)
                            .reshape([-1])
                            .to_device(device)
                    })
                    .collect::<Vec<_>>(),
                0,
            )
        });
        group.broadcast(&mut flat, owner)?;
        let mut at = 0;
        tch::no_grad(|| {
            for p in mine {
                let n = p.numel() as i64;
                let part = flat.narrow(0, at, n).view_as(p).to_device(p.device());
                p.shallow_clone().copy_(&part.to_kind(p.kind()));
                at += n;
            }
        });
    }
    Ok(())
}

/// Which rank owns each parameter's optimizer state under ZeRO-1: largest
/// parameters first, each to the rank holding the fewest elements (ties to
/// the lowest rank); indices follow `sizes`' order.
pub fn shard_owners(sizes: &[usize], world_size: usize) -> Vec<usize> {
    let mut order: Vec<usize> = (0..sizes.len()).collect();
    order.sort_by_key(|&i| (std::cmp::Reverse(sizes[i]), i));
    let mut load = vec![0usize; world_size.max(1)];
    let mut owners = vec![0; sizes.len()];
    for i in order {
        let (least, _) = load
            .iter()
            .enumerate()
            .min_by_key(|&(r, l)| (*l, r))
            .expect("world_size >= 1");
        load[least] += sizes[i];
        owners[i] = least;
    }
    owners
}

/// A hash of the trainable weights' names and bytes (a LoRA run's frozen
/// base never changes), equal on two ranks when their weights are bitwise
/// equal.
pub fn weights_hash(model: &Model) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    for (name, t) in model.trainable_parameters() {
        h.write(name.as_bytes());
        let flat = t
            .detach()
            .to_device(Device::Cpu)
            .to_kind(Kind::Float)
            .reshape([-1]);
        let values = Vec::<f32>::try_from(&flat).unwrap_or_default();
        let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        h.write(&bytes);
    }
    h.finish()
}

/// Fails unless every rank's weights hash the same (debug builds check it
/// after each data-parallel step); returns the hash.
pub fn check_same_weights(group: &mut ProcessGroup, model: &Model) -> Result<u64, RlError> {
    // i64 holds the hash's bits; max == min on every rank iff all agree.
    let h = weights_hash(model) as i64;
    let device = group.device();
    let mut max = Tensor::from_slice(&[h]).to_device(device);
    let mut min = max.copy();
    group.all_reduce(&mut max, ReduceOp::Max)?;
    group.all_reduce(&mut min, ReduceOp::Min)?;
    let (max, min) = (
        i64::try_from(&max.to_device(Device::Cpu))?,
        i64::try_from(&min.to_device(Device::Cpu))?,
    );
    if max != min {
        return Err(RlError::Input(format!(
            "data-parallel ranks diverged: rank {} weights hash {h:x}, others between {min:x} and {max:x}",
            group.rank()
        )));
    }
    Ok(h as u64)
}

/// Every rank calls this together: the whole optimizer's state as an
/// unsharded [`RlOptimizer::state_tensors`] would give it, each ZeRO-1
/// owner broadcasting its parameters' moments and step counts (for a
/// checkpoint; unsharded, this rank's own state, no communication).
pub fn gather_optimizer_state(
    model: &Model,
    optimizer: &RlOptimizer,
    group: &mut ProcessGroup,
) -> Result<Vec<(String, Tensor)>, RlError> {
    let Some(owners) = optimizer.owners() else {
        return Ok(optimizer.state_tensors());
    };
    let device = group.device();
    let own: std::collections::HashMap<String, Tensor> =
        optimizer.state_tensors().into_iter().collect();
    let mut out = Vec::new();
    for ((name, param), &owner) in model.trainable_parameters().iter().zip(owners) {
        for key in AdamW::state_names(name) {
            let mut t = match own.get(&key) {
                Some(t) => t.to_device(device),
                None if key.starts_with("step.") => Tensor::from(0i64).to_device(device),
                None => Tensor::zeros(param.size(), (Kind::Float, device)),
            };
            group.broadcast(&mut t, owner)?;
            out.push((key, t.to_device(param.device())));
        }
    }
    out.extend(
        optimizer
            .state_tensors()
            .into_iter()
            .filter(|(k, _)| !own_param_key(k)),
    );
    Ok(out)
}

/// An AdamW per-parameter key (as opposed to the optimizer's own, e.g. the
/// update count).
fn own_param_key(key: &str) -> bool {
    ["exp_avg.", "exp_avg_sq.", "step."]
        .iter()
        .any(|p| key.starts_with(p))
}
