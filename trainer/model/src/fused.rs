//! Fused elementwise ops for f32 on the CPU (`csrc/fused.cpp`, autograd
//! Functions over the loops of `csrc/fused_kernels.cpp`): a token's
//! logprob under a row of logits, SwiGLU's `silu(gate) * up`, and RMSNorm.
//! libtorch runs each as a chain of ops, a pass over memory and a
//! temporary apiece, forward and backward (the logprob alone: a `[N, V]`
//! log-softmax kept for backward, then zeros and a scatter for the gather's
//! gradient); each of these reads its inputs once and writes its outputs
//! once, and keeps less for backward. `trainer/rl/benches/step.rs` prints the
//! step they are part of against PyTorch eager.
//!
//! The values match the composites' to f32 rounding (sums in another
//! order), and a row's values do not depend on the other rows of its batch
//! (so not on the packing); the unit tests pin both, values and gradients
//! against the composites. Those stay the path for anything else: other
//! dtypes or devices, or a CPU without AVX2 and FMA on x86-64 (each
//! function then returns `None`).

use std::ffi::c_char;

use tch::{Device, Kind, Tensor};

use super::shim;

unsafe extern "C" {
    fn agl_fused_supported() -> bool;
    fn agl_fused_token_logprobs(
        logits: *const torch_sys::C_tensor,
        targets: *const torch_sys::C_tensor,
        scale: f64,
        err: *mut c_char,
        err_len: usize,
    ) -> *mut torch_sys::C_tensor;
    fn agl_fused_swiglu(
        gate: *const torch_sys::C_tensor,
        up: *const torch_sys::C_tensor,
        err: *mut c_char,
        err_len: usize,
    ) -> *mut torch_sys::C_tensor;
    fn agl_fused_rms_norm(
        x: *const torch_sys::C_tensor,
        weight: *const torch_sys::C_tensor,
        eps: f64,
        err: *mut c_char,
        err_len: usize,
    ) -> *mut torch_sys::C_tensor;
}

/// `log_softmax(logits / temperature)[i, targets[i]]` for `logits` `[N, V]`
/// and `targets` `[N]` (i64): `[N]` f32, on autograd's graph when the
/// logits require grad.
pub fn token_logprobs(logits: &Tensor, targets: &Tensor, temperature: f64) -> Option<Tensor> {
    if !(eligible(&[logits]) && temperature > 0.0 && targets.device() == Device::Cpu) {
        return None;
    }
    // SAFETY: both tensors are live for the call; see `shim`.
    call("token logprobs", |err, len| unsafe {
        agl_fused_token_logprobs(
            logits.as_ptr(),
            targets.as_ptr(),
            1.0 / temperature,
            err,
            len,
        )
    })
}

/// `silu(gate) * up`, both the same shape.
pub fn swiglu(gate: &Tensor, up: &Tensor) -> Option<Tensor> {
    if !eligible(&[gate, up]) || gate.size() != up.size() {
        return None;
    }
    // SAFETY: both tensors are live for the call; see `shim`.
    call("SwiGLU", |err, len| unsafe {
        agl_fused_swiglu(gate.as_ptr(), up.as_ptr(), err, len)
    })
}

/// `weight * (x * rsqrt(mean(x^2, -1) + eps))` for `x` `[..., H]` and
/// `weight` `[H]`.
pub fn rms_norm(x: &Tensor, weight: &Tensor, eps: f64) -> Option<Tensor> {
    if !eligible(&[x, weight])
        || weight.size().len() != 1
        || x.size().last() != weight.size().first()
    {
        return None;
    }
    // SAFETY: both tensors are live for the call; see `shim`.
    call("RMSNorm", |err, len| unsafe {
        agl_fused_rms_norm(x.as_ptr(), weight.as_ptr(), eps, err, len)
    })
}

/// f32 CPU tensors, on a CPU that runs the loops.
fn eligible(tensors: &[&Tensor]) -> bool {
    let f32_cpu = |t: &&Tensor| t.device() == Device::Cpu && t.kind() == Kind::Float;
    // SAFETY: a pure query of the CPU's features.
    tensors.iter().all(f32_cpu) && unsafe { agl_fused_supported() }
}

/// Runs one shim entry point: its tensor, or `None` (logged) when it
/// reports an error, so the caller takes libtorch's path.
fn call(
    op: &str,
    entry: impl FnOnce(*mut c_char, usize) -> *mut torch_sys::C_tensor,
) -> Option<Tensor> {
    shim::tensor_or_message(entry)
        .inspect_err(|msg| tracing::warn!(error = %msg, "fused {op} failed; using libtorch's ops"))
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn max_rel(a: &Tensor, b: &Tensor) -> f64 {
        let scale = f64::try_from(b.abs().max()).unwrap().max(1e-30);
        f64::try_from((a - b).abs().max()).unwrap() / scale
    }

    fn randn(shape: &[i64]) -> Tensor {
        Tensor::randn(shape, (Kind::Float, Device::Cpu)).set_requires_grad(true)
    }

    /// Gradients of `sum(y * up)` for each of `inputs`.
    fn grads(y: &Tensor, up: &Tensor, inputs: &[&Tensor]) -> Vec<Tensor> {
        Tensor::run_backward(&[(y * up).sum(Kind::Float)], inputs, false, false)
    }

    /// Whether the fused ops run here; where they do not, the test is
    /// reported skipped (the ops decline and the model takes libtorch's).
    #[track_caller]
    fn supported() -> bool {
        // SAFETY: a pure query of the CPU's features.
        let yes = unsafe { agl_fused_supported() };
        if !yes {
            crate::skip::skip("no AVX2/FMA on this CPU: the fused ops decline");
        }
        yes
    }

    /// Values and the logits' gradient against `log_softmax` + `gather`, at
    /// temperature 1 and 0.7, for a vocabulary that is not a multiple of
    /// the vector width and logits that are not contiguous.
    #[test]
    fn token_logprobs_match_log_softmax_and_gather() {
        if !supported() {
            return;
        }
        tch::manual_seed(3);
        let (n, v) = (37, 1003);
        let logits = (randn(&[v, n]) * 4.0).detach().set_requires_grad(true);
        let targets = Tensor::randint(v, [n], (Kind::Int64, Device::Cpu));
        let up = Tensor::randn([n], (Kind::Float, Device::Cpu));
        for temperature in [1.0, 0.7] {
            let x = logits.transpose(0, 1);
            let ours = token_logprobs(&x, &targets, temperature).expect("f32 CPU logits");
            let theirs = (&x / temperature)
                .log_softmax(-1, None)
                .gather(1, &targets.unsqueeze(-1), false)
                .squeeze_dim(-1);
            assert_eq!(ours.size(), [n]);
            assert!(max_rel(&ours, &theirs) < 1e-5, "values at t={temperature}");
            let (g, r) = (
                grads(&ours, &up, &[&logits]),
                grads(&theirs, &up, &[&logits]),
            );
            assert!(max_rel(&g[0], &r[0]) < 1e-5, "gradient at t={temperature}");
        }
    }

    /// A target outside the vocabulary is an error the caller sees as
    /// `None` (and then libtorch's own error), never a read out of bounds.
    #[test]
    fn token_logprobs_decline_a_target_outside_the_vocabulary() {
        let logits = Tensor::randn([2, 5], (Kind::Float, Device::Cpu));
        let targets = Tensor::from_slice(&[1i64, 5]);
        assert!(token_logprobs(&logits, &targets, 1.0).is_none());
        assert!(
            token_logprobs(&logits, &targets.clamp(0, 4), 0.0).is_none(),
            "temperature 0"
        );
        let bf16 = logits.to_kind(Kind::BFloat16);
        assert!(
            token_logprobs(&bf16, &targets.clamp(0, 4), 1.0).is_none(),
            "bf16"
        );
    }

    #[test]
    fn swiglu_matches_silu_times_up() {
        if !supported() {
            return;
        }
        tch::manual_seed(4);
        let (gate, upp) = (randn(&[3, 5, 131]), randn(&[3, 5, 131]));
        let ours = swiglu(&gate, &upp).expect("f32 CPU operands");
        let theirs = gate.silu() * &upp;
        assert!(max_rel(&ours, &theirs) < 1e-6);
        let up = Tensor::randn([3, 5, 131], (Kind::Float, Device::Cpu));
        let (g, r) = (
            grads(&ours, &up, &[&gate, &upp]),
            grads(&theirs, &up, &[&gate, &upp]),
        );
        assert!(max_rel(&g[0], &r[0]) < 1e-6, "d/dgate");
        assert!(max_rel(&g[1], &r[1]) < 1e-6, "d/dup");
        assert!(
            swiglu(&gate, &upp.narrow(2, 0, 130)).is_none(),
            "shapes differ"
        );
    }

    /// Against the composite `RmsNorm` ran before (f32 variance, rsqrt,
    /// times the weight), on rows of a width that is not a multiple of the
    /// vector width, with and without the weight's gradient.
    #[test]
    fn rms_norm_matches_the_composite() {
        if !supported() {
            return;
        }
        tch::manual_seed(5);
        let x = randn(&[4, 9, 67]);
        let w = (randn(&[67]) + 1.0).detach().set_requires_grad(true);
        let eps = 1e-5;
        let composite = |x: &Tensor, w: &Tensor| {
            let variance = x.square().mean_dim(-1, true, Kind::Float);
            w * (x * (variance + eps).rsqrt())
        };
        let ours = rms_norm(&x, &w, eps).expect("f32 CPU operands");
        let theirs = composite(&x, &w);
        assert!(max_rel(&ours, &theirs) < 1e-6);
        let up = Tensor::randn([4, 9, 67], (Kind::Float, Device::Cpu));
        let (g, r) = (grads(&ours, &up, &[&x, &w]), grads(&theirs, &up, &[&x, &w]));
        assert!(max_rel(&g[0], &r[0]) < 1e-5, "d/dx");
        assert!(max_rel(&g[1], &r[1]) < 1e-5, "d/dweight");

        // A frozen weight (LoRA) gets no gradient; the input still does.
        let frozen = w.detach();
        let y = rms_norm(&x, &frozen, eps).expect("f32 CPU operands");
        let g = grads(&y, &up, &[&x]);
        let r = grads(&composite(&x, &frozen), &up, &[&x]);
        assert!(max_rel(&g[0], &r[0]) < 1e-5);
        assert!(!frozen.grad().defined());
        assert!(
            rms_norm(&x, &w.narrow(0, 0, 66), eps).is_none(),
            "width differs"
        );
    }

    /// Each row is computed alone: a row gives the same bits in a batch of
    /// 50 rows as in a batch of 20, so how samples are packed into
    /// micro-batches changes no value.
    #[test]
    fn a_row_does_not_depend_on_its_batch() {
        if !supported() {
            return;
        }
        tch::manual_seed(9);
        let opts = (Kind::Float, Device::Cpu);
        let (x, u) = (
            Tensor::randn([50, 131], opts),
            Tensor::randn([50, 131], opts),
        );
        let w = Tensor::randn([131], opts);
        let t = Tensor::randint(131, [50], (Kind::Int64, Device::Cpu));
        let part = |a: &Tensor| a.narrow(0, 3, 20).contiguous();
        let same = |whole: Tensor, rows: Tensor| assert!(part(&whole).equal(&rows));
        same(
            swiglu(&x, &u).unwrap(),
            swiglu(&part(&x), &part(&u)).unwrap(),
        );
        same(
            rms_norm(&x, &w, 1e-5).unwrap(),
            rms_norm(&part(&x), &w, 1e-5).unwrap(),
        );
        let lp = |x: &Tensor, t: &Tensor| token_logprobs(x, t, 0.8).unwrap();
        same(lp(&x, &t), lp(&part(&x), &part(&t)));
    }
}
