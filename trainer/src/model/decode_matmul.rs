//! `x W^T` for a one-sequence decode step on the CPU: one row against each
//! weight matrix, so the step is a read of every weight and its speed is
//! the memory bandwidth's. libtorch hands this shape to MKL's `sgemv`,
//! which on the AMD cores of this project's machines streams the weights
//! at ~16 GB/s where a plain read reaches ~40; the `gemm` crate (candle's
//! CPU matmul) reads them at ~31 GB/s, which took the embedded engine's
//! batch-1 decode of SmolLM2 f32 from 24 to 44 tokens/s
//! (`trainer/benches/engine.rs` prints it beside the bandwidth bound). For
//! 2-16 rows the crate packs the weights as MKL does and is no faster
//! (8-11 GB/s measured), so those stay on libtorch.
//!
//! Only for inference: the result has no autograd graph. Anything else
//! (another device or dtype, more rows, non-contiguous operands) returns
//! `None` and the caller takes libtorch's path.

use tch::{Device, Kind, Tensor};

/// Rows (sequences in one decode step) taken here; see the module docs.
pub const MAX_ROWS: i64 = 1;

/// `x` `[..., in]` times `weight` `[out, in]` transposed: `[..., out]`.
pub fn linear(x: &Tensor, weight: &Tensor) -> Option<Tensor> {
    let (Ok([out_dim, in_dim]), Some(&k)) = (<[i64; 2]>::try_from(weight.size()), x.size().last())
    else {
        return None;
    };
    let eligible =
        |t: &Tensor| t.device() == Device::Cpu && t.kind() == Kind::Float && t.is_contiguous();
    let rows = x.numel() as i64 / in_dim.max(1);
    if k != in_dim || rows == 0 || rows > MAX_ROWS || !eligible(x) || !eligible(weight) {
        return None;
    }
    let mut shape = x.size();
    *shape.last_mut()? = out_dim;
    let y = Tensor::empty(&shape[..], (Kind::Float, Device::Cpu));
    let (m, n, k) = (rows as usize, out_dim as usize, in_dim as usize);
    let threads = usize::try_from(tch::get_num_threads()).unwrap_or(1).max(1);
    // SAFETY: the three tensors are contiguous f32 on the CPU with the
    // sizes named (checked above; `y` was just allocated with them), and
    // `y` aliases neither input. Strides are in elements: `y` and `x` are
    // row-major `[m, n]` and `[m, k]`; `weight` row-major `[n, k]` is the
    // right-hand side `[k, n]` with row stride 1 and column stride `k`.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            y.data_ptr() as *mut f32,
            1,
            n as isize,
            false,
            x.data_ptr() as *const f32,
            1,
            k as isize,
            weight.data_ptr() as *const f32,
            k as isize,
            1,
            0.0,
            1.0,
            false,
            false,
            false,
            gemm::Parallelism::Rayon(threads),
        );
    }
    Some(y)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_libtorch() {
        tch::manual_seed(0);
        let w = Tensor::randn([300, 97], (Kind::Float, Device::Cpu));
        for rows in 1..=MAX_ROWS {
            let x = Tensor::randn([rows, 1, 97], (Kind::Float, Device::Cpu));
            let fast = linear(&x, &w).expect("eligible");
            let reference = x.linear(&w, None::<Tensor>);
            assert_eq!(fast.size(), reference.size());
            let diff = (&fast - &reference).abs().max().double_value(&[]);
            assert!(diff < 1e-4, "{rows} rows: max diff {diff}");
        }
    }

    #[test]
    fn declines_what_it_does_not_cover() {
        let w = Tensor::randn([8, 4], (Kind::Float, Device::Cpu));
        let x = Tensor::randn([MAX_ROWS + 1, 4], (Kind::Float, Device::Cpu));
        assert!(linear(&x, &w).is_none(), "a prefill's rows");
        assert!(linear(&x.narrow(0, 0, 2).to_kind(Kind::BFloat16), &w).is_none());
        let strided = Tensor::randn([4, 2], (Kind::Float, Device::Cpu)).transpose(0, 1);
        assert!(linear(&strided, &w).is_none(), "a non-contiguous input");
        assert!(linear(&Tensor::randn([2, 5], (Kind::Float, Device::Cpu)), &w).is_none());
    }
}
