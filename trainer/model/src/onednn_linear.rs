//! `x W^T` in f32 on the CPU through oneDNN, with its own backward
//! (`csrc/onednn_linear.cpp`, an autograd Function). libtorch sends f32
//! `mm` on the CPU to MKL, which on the AMD cores of this project's
//! machines runs its AVX2 kernels (`sgemm_kernel_0_zen`): ~170 GFLOP/s on
//! 2 cores for the trainer's shapes, where oneDNN (shipped inside libtorch,
//! dispatching on the ISA alone) runs AVX-512 at ~300-400. The forward and
//! both gradients are each one oneDNN matmul, so a training step's GEMMs
//! (forward and backward) all take it; `trainer/rl/benches/step.rs` prints the
//! step against PyTorch eager.
//!
//! The result matches libtorch's to f32 rounding (the sums run in another
//! order); the unit tests pin values and gradients against `Tensor::linear`.
//! Anything other than f32 CPU operands returns `None` and the caller takes
//! libtorch's path; so does every call on a CPU whose ISA libtorch's
//! `mkldnn_matmul` refuses (it wants AVX-512 BW/VL/DQ, AVX-NE-CONVERT or a
//! Graviton3; on AVX2 alone MKL's kernels are what it would run anyway),
//! found out once by a 1x1 product rather than by an error per call.

use std::ffi::c_char;
use std::sync::OnceLock;

use tch::{Device, Kind, Tensor};

use super::shim;

unsafe extern "C" {
    fn agl_onednn_linear(
        x: *const torch_sys::C_tensor,
        w: *const torch_sys::C_tensor,
        err: *mut c_char,
        err_len: usize,
    ) -> *mut torch_sys::C_tensor;
}

/// `x` `[..., in]` times `weight` `[out, in]` transposed: `[..., out]`, on
/// autograd's graph when either requires grad.
pub fn linear(x: &Tensor, weight: &Tensor) -> Option<Tensor> {
    let (Ok([_, in_dim]), Some(&k)) = (<[i64; 2]>::try_from(weight.size()), x.size().last()) else {
        return None;
    };
    let eligible = |t: &Tensor| t.device() == Device::Cpu && t.kind() == Kind::Float;
    if k != in_dim || x.numel() == 0 || !eligible(x) || !eligible(weight) || !available() {
        return None;
    }
    match product(x, weight) {
        Ok(y) => Some(y),
        Err(msg) => {
            tracing::warn!(error = %msg, "oneDNN linear failed; using libtorch's");
            None
        }
    }
}

/// Whether this CPU runs oneDNN's f32 matmul (see the module comment).
fn available() -> bool {
    static AVAILABLE: OnceLock<bool> = OnceLock::new();
    *AVAILABLE.get_or_init(|| {
        let one = Tensor::ones([1, 1], (Kind::Float, Device::Cpu));
        let probe = product(&one, &one);
        if let Err(msg) = &probe {
            tracing::info!(reason = %msg, "f32 matmuls take libtorch's path: no oneDNN on this CPU");
        }
        probe.is_ok()
    })
}

/// The shim's product, or its error message.
fn product(x: &Tensor, weight: &Tensor) -> Result<Tensor, String> {
    // SAFETY: both pointers are live tensors borrowed for the call.
    shim::tensor_or_message(|err, len| unsafe {
        agl_onednn_linear(x.as_ptr(), weight.as_ptr(), err, len)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn max_rel(a: &Tensor, b: &Tensor) -> f64 {
        let scale = f64::try_from(b.abs().max()).unwrap().max(1e-30);
        f64::try_from((a - b).abs().max()).unwrap() / scale
    }

    /// Whether oneDNN runs here; where it does not, `x W^T` of operands it
    /// would take is declined (the caller takes libtorch's path) and the
    /// test is reported skipped.
    #[track_caller]
    fn runs_here(x: &Tensor, w: &Tensor) -> bool {
        if available() {
            return true;
        }
        assert!(linear(x, w).is_none(), "declined without oneDNN");
        crate::skip::skip("oneDNN's f32 matmul does not run on this CPU");
        false
    }

    /// A CPU with the ISA libtorch asks for gets the oneDNN path.
    #[test]
    #[cfg(target_arch = "x86_64")]
    fn an_avx512_cpu_takes_onednn() {
        let avx512 = is_x86_feature_detected!("avx512bw")
            && is_x86_feature_detected!("avx512vl")
            && is_x86_feature_detected!("avx512dq");
        if !avx512 {
            crate::skip::skip("no AVX-512 BW/VL/DQ on this CPU");
            return;
        }
        assert!(available(), "AVX-512 BW/VL/DQ but no oneDNN matmul");
    }

    /// Values and both gradients against libtorch's linear, for a 3-D
    /// input and an upstream gradient that is not contiguous.
    #[test]
    fn matches_libtorch_values_and_gradients() {
        tch::manual_seed(1);
        let x = Tensor::randn([3, 37, 96], (Kind::Float, Device::Cpu)).set_requires_grad(true);
        let w = Tensor::randn([50, 96], (Kind::Float, Device::Cpu)).set_requires_grad(true);
        let up = Tensor::randn([50, 37, 3], (Kind::Float, Device::Cpu)).permute([2, 1, 0]);
        if !runs_here(&x, &w) {
            return;
        }

        let ours = linear(&x, &w).expect("f32 CPU operands take oneDNN");
        let theirs = x.linear(&w, None::<Tensor>);
        assert_eq!(ours.size(), [3, 37, 50]);
        assert!(max_rel(&ours, &theirs) < 1e-5);

        let grads = |y: &Tensor| {
            let g = Tensor::run_backward(&[(y * &up).sum(Kind::Float)], &[&x, &w], false, false);
            (g[0].shallow_clone(), g[1].shallow_clone())
        };
        let ((gx, gw), (rx, rw)) = (grads(&ours), grads(&theirs));
        assert!(max_rel(&gx, &rx) < 1e-5, "dL/dx differs");
        assert!(max_rel(&gw, &rw) < 1e-5, "dL/dW differs");
    }

    /// A frozen weight (LoRA's base) gets no gradient and the input still
    /// does; under `no_grad` the result has no graph.
    #[test]
    fn frozen_weight_and_no_grad() {
        let x = Tensor::randn([5, 16], (Kind::Float, Device::Cpu)).set_requires_grad(true);
        let w = Tensor::randn([8, 16], (Kind::Float, Device::Cpu));
        if !runs_here(&x, &w) {
            return;
        }
        let y = linear(&x, &w).expect("oneDNN");
        let g = Tensor::run_backward(&[y.sum(Kind::Float)], &[&x], false, false);
        let expected = w
            .sum_dim_intlist(0, true, Kind::Float)
            .expand([5, 16], false);
        assert!(max_rel(&g[0], &expected) < 1e-5);
        assert!(!w.grad().defined());

        let y = tch::no_grad(|| linear(&x, &w).expect("oneDNN"));
        assert!(!y.requires_grad());
    }

    #[test]
    fn declines_what_it_does_not_take() {
        let x = Tensor::randn([2, 4], (Kind::Float, Device::Cpu));
        let w = Tensor::randn([3, 5], (Kind::Float, Device::Cpu));
        assert!(linear(&x, &w).is_none(), "inner sizes differ");
        let w = Tensor::randn([3, 4], (Kind::Double, Device::Cpu));
        assert!(linear(&x, &w).is_none(), "f64");
    }
}
