//! The ranks one step runs on: [`OneRank`] alone, or every rank of a c10d
//! [`ProcessGroup`] ([`crate::data_parallel`]). [`crate::train_step`] is
//! written once over this trait: a rank runs its share of the micro-batches,
//! the ranks add up their gradients (in flat buckets) and token sums, and
//! after the optimizer step a ZeRO-1 parameter's new value goes from its
//! owner to every rank.

use tch::{Device, Kind, Tensor};

use crate::RlError;
use crate::data_parallel::{check_same_weights, rank_share};
use crate::dist::{ProcessGroup, ReduceOp};
use crate::pack::Packing;
use crate::stats::StepSums;
use agl_model::Model;

/// How the ranks of a step share and combine its work.
pub trait Collective {
    /// The micro-batches of the step's packing this rank runs.
    fn share(&self, packing: &Packing) -> Packing;
    /// Adds every rank's gradients (of `params`) and token sums into each
    /// rank's.
    fn reduce(&mut self, params: &[Tensor], sums: &mut StepSums) -> Result<(), RlError>;
    /// After the optimizer step: each parameter's new value from the rank
    /// that updated it (`owners`: ZeRO-1's, `None` when every rank steps
    /// every parameter).
    fn publish(
        &mut self,
        model: &Model,
        params: &[Tensor],
        owners: Option<&[usize]>,
    ) -> Result<(), RlError>;
}

/// One process trains alone: it runs every micro-batch and shares nothing.
#[derive(Debug, Clone, Copy, Default)]
pub struct OneRank;

impl Collective for OneRank {
    fn share(&self, packing: &Packing) -> Packing {
        packing.clone()
    }

    fn reduce(&mut self, _: &[Tensor], _: &mut StepSums) -> Result<(), RlError> {
        Ok(())
    }

    fn publish(&mut self, _: &Model, _: &[Tensor], _: Option<&[usize]>) -> Result<(), RlError> {
        Ok(())
    }
}

impl Collective for ProcessGroup {
    fn share(&self, packing: &Packing) -> Packing {
        rank_share(packing, self.rank(), self.world_size())
    }

    fn reduce(&mut self, params: &[Tensor], sums: &mut StepSums) -> Result<(), RlError> {
        materialise_grads(params);
        all_reduce_grads(self, params)?;
        all_reduce_sums(self, sums)
    }

    fn publish(
        &mut self,
        model: &Model,
        params: &[Tensor],
        owners: Option<&[usize]>,
    ) -> Result<(), RlError> {
        if let Some(owners) = owners {
            broadcast_from_owners(self, params, owners)?;
        }
        if cfg!(debug_assertions) {
            let hash = check_same_weights(self, model)?;
            tracing::info!(
                rank = self.rank(),
                weights_hash = format!("{hash:016x}"),
                "data-parallel ranks hold the same weights"
            );
        }
        Ok(())
    }
}

/// Gradient buckets for the all-reduce: 25 MiB of f32 each, like DDP's
/// default `bucket_cap_mb`.
const BUCKET_ELEMENTS: i64 = 25 * 1024 * 1024 / 4;

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
