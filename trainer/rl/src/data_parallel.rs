//! Data-parallel training over a libtorch c10d process group
//! ([`crate::dist::ProcessGroup`]): every rank holds the same weights and
//! the same [`UpdateBatch`](crate::UpdateBatch), whose per-token weights
//! were fixed before any split (`w = m / (N T_i)`, ARCHITECTURE.md,
//! Training), so the batch gradient is the sum of any partition's
//! gradients.
//!
//! [`crate::train_step`] over a group ([`crate::Collective`]): the
//! micro-batches of the one-process packing go to ranks ([`rank_share`]:
//! largest first, each to the least loaded rank); each rank runs forward +
//! backward on its share; the gradients are summed across ranks in flat
//! buckets; the statistics' token sums too. Then every rank clips the same
//! global norm and steps the same AdamW, so the weights stay equal
//! ([`check_same_weights`]). With ZeRO-1 ([`RlOptimizer::new_sharded`])
//! each parameter's AdamW state lives on one rank only (its owner, chosen
//! by size): the owner updates it and broadcasts the new value, as
//! `torch.distributed.optim.ZeroRedundancyOptimizer` does.

use std::hash::Hasher;

use tch::{Device, Kind, Tensor};

use crate::RlError;
use crate::adamw::AdamW;
use crate::dist::{ProcessGroup, ReduceOp};
use crate::optimizer::RlOptimizer;
use crate::pack::{MicroBatch, Packing};
use agl_model::Model;

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
