//! `x W^T` for a decode step on the CPU: one row per sequence (1 to 8)
//! against each weight matrix, so the step is a read of every weight and
//! its speed is the memory bandwidth's. libtorch hands these shapes to
//! MKL's `sgemv`/`sgemm`, which on the AMD cores of this project's machines
//! streams the weights at ~16 GB/s for one row and ~12 for eight (it
//! repacks the weight matrix on every call), where a plain read reaches
//! ~40. Measured on 2 cores, the kernels here:
//!
//! - AVX-512 (`avx512`): each weight row is read once and multiplied into
//!   every input row held in registers (the inputs packed so that their
//!   16-lane blocks lie together), 2-4 weight rows at a time so each input
//!   load feeds several FMAs, the weight rows prefetched ahead, the output
//!   rows split over the calling thread's team (`model::team`). On a
//!   49152 x 576 matrix: 47-50 GB/s for one row, 37-44 for two, 38-39 for
//!   four, 29 for eight (4 rows a block then; before the blocking and
//!   prefetch: 40, 34, 21-25 and 16).
//! - AVX2 with FMA (`avx2`), on CPUs without AVX-512: the same kernel on
//!   8-lane vectors, fewer weight rows per block (16 registers). On an
//!   AVX2-only EPYC (2 cores), the engine's f32 decode went from 27.6 to
//!   45.3 tok/s at batch 1 (47% -> 74% of the bandwidth bound) and from
//!   56.3 to 178.7 at batch 8, where one row went through the `gemm`
//!   crate and more stayed on libtorch. One input then went row by row
//!   (each weight row read start to end, see the `kernel!` use).
//! - Without either, one row goes through the `gemm` crate (candle's CPU
//!   matmul); more rows stay on libtorch.
//!
//! `trainer/engine/benches/engine.rs` prints the engine's tokens/s beside the
//! bandwidth bound. Only for inference: the result has no autograd graph.
//! Anything else (another device or dtype, more rows, non-contiguous
//! operands) returns `None` and the caller takes libtorch's path.

use tch::{Device, Kind, Tensor};

/// Rows (sequences in one decode step) taken here; see the module docs.
pub const MAX_ROWS: i64 = 8;

/// `x` `[..., in]` times `weight` `[out, in]` transposed: `[..., out]`.
pub fn linear(x: &Tensor, weight: &Tensor) -> Option<Tensor> {
    let (Ok([out_dim, in_dim]), Some(&k)) = (<[i64; 2]>::try_from(weight.size()), x.size().last())
    else {
        return None;
    };
    let (m, n, k) = (
        x.numel() / in_dim.max(1) as usize,
        out_dim as usize,
        k as usize,
    );
    if k != in_dim as usize || m == 0 || m > MAX_ROWS as usize || !covers(m, k) {
        return None;
    }
    let (xs, ws) = (f32s(x)?, f32s(weight)?);
    let mut shape = x.size();
    *shape.last_mut()? = out_dim;
    let mut y = Tensor::empty(&shape[..], (Kind::Float, Device::Cpu));
    rows(xs, ws, f32s_mut(&mut y)?, m, n, k);
    Some(y)
}

/// A contiguous f32 CPU tensor's elements.
pub fn f32s(t: &Tensor) -> Option<&[f32]> {
    let ok = t.device() == Device::Cpu && t.kind() == Kind::Float && t.is_contiguous();
    // SAFETY: checked to be contiguous f32 on the CPU, so `numel` floats
    // from `data_ptr`, alive while `t` is borrowed.
    ok.then(|| unsafe { std::slice::from_raw_parts(t.data_ptr() as *const f32, t.numel()) })
}

/// [`f32s`], writable. The caller uses no other handle to `t`'s storage
/// (a view, a shallow clone) while the slice lives.
pub fn f32s_mut(t: &mut Tensor) -> Option<&mut [f32]> {
    let ok = t.device() == Device::Cpu && t.kind() == Kind::Float && t.is_contiguous();
    // SAFETY: as `f32s`, `t` borrowed mutably, and the caller's promise.
    ok.then(|| unsafe { std::slice::from_raw_parts_mut(t.data_ptr() as *mut f32, t.numel()) })
}

/// Whether [`rows`] takes `m` rows of `k` inputs: 1-8 rows with AVX-512
/// (`k` a multiple of 16) or AVX2 and FMA (of 8), one row without.
pub fn covers(m: usize, k: usize) -> bool {
    #[cfg(target_arch = "x86_64")]
    if (1..=MAX_ROWS as usize).contains(&m) && (avx512::usable(k) || avx2::usable(k)) {
        return true;
    }
    m == 1
}

/// `y [m, n] = x [m, k] W^T` for `w` `[n, k]` on slices, for shapes
/// [`covers`] takes (panics on others).
pub fn rows(x: &[f32], w: &[f32], y: &mut [f32], m: usize, n: usize, k: usize) {
    rows_many(x, &mut [(w, y, n)], m, k);
}

/// [`rows`] for several weights `(w [n, k], y [m, n], n)` that share the
/// input, in one parallel loop (one hand-off instead of one per weight).
pub fn rows_many(x: &[f32], outs: &mut [(&[f32], &mut [f32], usize)], m: usize, k: usize) {
    assert!(covers(m, k), "{m} rows of {k} are not covered");
    assert!(x.len() == m * k);
    assert!(
        outs.iter()
            .all(|(w, y, n)| w.len() == n * k && y.len() == m * n)
    );
    #[cfg(target_arch = "x86_64")]
    if avx512::usable(k) {
        avx512::linear(x, outs, m, k);
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if avx2::usable(k) {
        avx2::linear(x, outs, m, k);
        return;
    }
    for (w, y, n) in outs {
        one_row_gemm(x, w, y, *n, k);
    }
}

/// `y [1, n] = x [1, k] W^T` with the `gemm` crate.
fn one_row_gemm(x: &[f32], w: &[f32], y: &mut [f32], n: usize, k: usize) {
    let threads = super::team::threads();
    // SAFETY: the slices hold exactly the elements the sizes and strides
    // below reach. Strides are in elements: `y` and `x` are row vectors;
    // `w` row-major `[n, k]` is the right-hand side `[k, n]` with row
    // stride 1 and column stride `k`.
    unsafe {
        gemm::gemm(
            1,
            n,
            k,
            y.as_mut_ptr(),
            1,
            n as isize,
            false,
            x.as_ptr(),
            1,
            k as isize,
            w.as_ptr(),
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
}

/// One kernel module per instruction set from one body: `$feature`s the
/// target features, `$v` a vector of `$lanes` f32s and its intrinsics, `$r`
/// the weight rows per block for 1..=8 inputs (`R` below): enough to feed
/// each input load to several FMAs, few enough that the `R * M`
/// accumulators, `R` weight vectors and the input fit the ISA's registers.
#[cfg(target_arch = "x86_64")]
macro_rules! kernel {
    ($name:ident, [$($feature:tt),+], $v:ty, $lanes:literal,
     $zero:ident, $add:ident, $load:ident, $fma:ident, $reduce:path, $r:expr,
     $one_by_one:expr) => {
#[cfg(target_arch = "x86_64")]
mod $name {

    #[allow(unused_imports)]
    use std::arch::x86_64::*;

    const LANES: usize = $lanes;
    /// Floats ahead of the current chunk a weight row is prefetched (4 KiB):
    /// the hardware prefetcher alone left one input at ~40 GB/s; 1 KiB
    /// ahead was as good for one input, not for eight.
    const PREFETCH: usize = 1024;
    /// One input: each weight row by itself ([`row`]) instead of `R` rows
    /// in step (each `kernel!` use says why).
    const ONE_BY_ONE: bool = $one_by_one;
    /// Output rows per task, at least: fewer cost more in hand-offs.
    const MIN_BLOCK: usize = 64;
    /// Tasks per thread: a thread that starts late (descheduled on a
    /// shared host) takes what is left instead of a fixed share the others
    /// then wait for.
    const TASKS_PER_THREAD: usize = 8;

    pub fn usable(k: usize) -> bool {
        k.is_multiple_of(LANES) $(&& std::arch::is_x86_feature_detected!($feature))+
    }

    /// The operands of one call, shared by its tasks.
    #[derive(Clone, Copy)]
    struct Operands {
        /// `x` packed: `[k / 16][m][16]`.
        packed: *const f32,
        w: *const f32,
        y: *mut f32,
        m: usize,
        n: usize,
        k: usize,
    }

    // SAFETY: the pointers outlive the parallel loop that uses them (it
    // ends before `linear` returns), the inputs are only read, and each
    // task writes the output entries of its own output rows only.
    unsafe impl Send for Operands {}
    unsafe impl Sync for Operands {}

    /// `y [m, n] = x [m, k] W^T` for every `(w [n, k], y, n)` of `outs`,
    /// `m` in 1..=8, `k` a multiple of `LANES` on a CPU with the
    /// module's features (see [`usable`]). One parallel loop over all the outputs.
    pub fn linear(x: &[f32], outs: &mut [(&[f32], &mut [f32], usize)], m: usize, k: usize) {
        assert!((1..=8).contains(&m) && k.is_multiple_of(LANES) && x.len() == m * k);
        assert!(
            outs.iter()
                .all(|(w, y, n)| w.len() == n * k && y.len() == m * n)
        );
        let mut packed = vec![0f32; m * k];
        for c in 0..k / LANES {
            for r in 0..m {
                packed[(c * m + r) * LANES..][..LANES]
                    .copy_from_slice(&x[r * k + c * LANES..][..LANES]);
            }
        }
        let parts: Vec<Operands> = outs
            .iter_mut()
            .map(|(w, y, n)| Operands {
                packed: packed.as_ptr(),
                w: w.as_ptr(),
                y: y.as_mut_ptr(),
                m,
                n: *n,
                k,
            })
            .collect();
        // The outputs of all parts laid end to end, split evenly.
        let total: usize = parts.iter().map(|p| p.n).sum();
        let tasks = (TASKS_PER_THREAD * crate::team::threads())
            .min(total.div_ceil(MIN_BLOCK))
            .max(1);
        let block = total.div_ceil(tasks);
        crate::team::for_each(tasks, |t| {
            let (lo, hi) = (t * block, ((t + 1) * block).min(total));
            let mut start = 0;
            for ops in &parts {
                let (a, b) = (lo.max(start), hi.min(start + ops.n));
                if a < b {
                    // SAFETY: `usable` was checked by the caller (the
                    // features are there); the asserts above bound every offset
                    // `rows_of` reaches; the tasks' ranges do not overlap.
                    unsafe { rows_of(*ops, a - start, b - start) }
                }
                start += ops.n;
            }
        });
    }

    #[target_feature($(enable = $feature),+)]
    unsafe fn rows_of(ops: Operands, o0: usize, o1: usize) {
        // SAFETY: as `linear` says.
        unsafe {
            match ops.m {
                1 => rows::<1, { $r[0] }>(ops, o0, o1),
                2 => rows::<2, { $r[1] }>(ops, o0, o1),
                3 => rows::<3, { $r[2] }>(ops, o0, o1),
                4 => rows::<4, { $r[3] }>(ops, o0, o1),
                5 => rows::<5, { $r[4] }>(ops, o0, o1),
                6 => rows::<6, { $r[5] }>(ops, o0, o1),
                7 => rows::<7, { $r[6] }>(ops, o0, o1),
                _ => rows::<8, { $r[7] }>(ops, o0, o1),
            }
        }
    }

    /// Output rows `o0..o1`, `R` at a time (then one at a time for the
    /// rest): each weight row read once, `R * M` accumulators. Each input
    /// load then feeds `R` FMAs, and one input runs `R` independent FMA
    /// chains. `R` per `M` from the kernel's table (`rows_of`; each
    /// `kernel!` use says how its table was chosen).
    #[target_feature($(enable = $feature),+)]
    unsafe fn rows<const M: usize, const R: usize>(ops: Operands, o0: usize, o1: usize) {
        if M == 1 && ONE_BY_ONE {
            for o in o0..o1 {
                // SAFETY: `o < o1 <= n`.
                unsafe { row(ops, o) };
            }
            return;
        }
        let mut o = o0;
        while o + R <= o1 {
            // SAFETY: `o + R <= o1 <= n`, as `block` says.
            unsafe { block::<M, R>(ops, o) };
            o += R;
        }
        for o in o..o1 {
            // SAFETY: `o < o1 <= n`.
            unsafe { block::<M, 1>(ops, o) };
        }
    }

    /// Output row `o` (`o < n`) for one input: the weight row read from
    /// start to end, four accumulators in turn so the FMAs do not wait on
    /// each other.
    #[target_feature($(enable = $feature),+)]
    unsafe fn row(ops: Operands, o: usize) {
        let Operands { packed, w, y, k, .. } = ops;
        // SAFETY: `o < n`, so `k` floats from `w + o * k` lie in `w`; the
        // packed input of one row is `k` floats; `y` holds `n`.
        unsafe {
            let row = w.add(o * k);
            let mut acc = [$zero(); 4];
            let chunks = k / LANES;
            for c in (0..chunks - chunks % 4).step_by(4) {
                for (u, a) in acc.iter_mut().enumerate() {
                    let at = (c + u) * LANES;
                    *a = $fma($load(row.add(at)), $load(packed.add(at)), *a);
                }
            }
            for c in chunks - chunks % 4..chunks {
                acc[0] = $fma($load(row.add(c * LANES)), $load(packed.add(c * LANES)), acc[0]);
            }
            *y.add(o) = $reduce($add($add(acc[0], acc[1]), $add(acc[2], acc[3])));
        }
    }

    /// Output rows `o..o + R` (`o + R <= n`).
    #[target_feature($(enable = $feature),+)]
    unsafe fn block<const M: usize, const R: usize>(ops: Operands, o: usize) {
        let Operands {
            packed, w, y, n, k, ..
        } = ops;
        // SAFETY: `o + R <= n` and every chunk `c < k / LANES`, so the loads
        // stay in `w` (`n * k`) and `packed` (`M * k`), the stores in `y`
        // (`M * n`).
        unsafe {
            let rows: [*const f32; R] = std::array::from_fn(|j| w.add((o + j) * k));
            let mut acc = [[$zero(); M]; R];
            for c in 0..k / LANES {
                for row in &rows {
                    std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(
                        row.wrapping_add(c * LANES + PREFETCH) as *const i8,
                    );
                }
                let wv: [$v; R] =
                    std::array::from_fn(|j| $load(rows[j].add(c * LANES)));
                let xs = packed.add(c * LANES * M);
                for r in 0..M {
                    let xv = $load(xs.add(r * LANES));
                    for (accs, wv) in acc.iter_mut().zip(&wv) {
                        accs[r] = $fma(*wv, xv, accs[r]);
                    }
                }
            }
            for (j, accs) in acc.iter().enumerate() {
                for (r, a) in accs.iter().enumerate() {
                    *y.add(r * n + o + j) = $reduce(*a);
                }
            }
        }
    }
}
    };
}

// 32 zmm registers: 4 rows up to four inputs, 2 for five to eight (`R * M`
// accumulators, `R` weight vectors and the input must fit: 4 rows for
// eight, first measured fastest, spill, and on a 2-vCPU Xeon a SmolLM2
// step's matrices read at 11.7-11.9 GB/s for eight inputs with 4 rows, 14.9
// with 3, 18.5 with 2; batch 8 115-125 -> 144-177 tok/s). One input in blocks
// of 4 rows too: 47-50 GB/s on the AVX-512 machines it was measured on.
#[cfg(target_arch = "x86_64")]
kernel!(
    avx512,
    ["avx512f"],
    __m512,
    16,
    _mm512_setzero_ps,
    _mm512_add_ps,
    _mm512_loadu_ps,
    _mm512_fmadd_ps,
    _mm512_reduce_add_ps,
    [4, 4, 4, 4, 2, 2, 2, 2],
    false
);

// 16 ymm registers: `R * M + R + 1` of them at most (sized to fit, not
// measured per `M`). One input row by row: on the AVX2-only EPYC, over a
// SmolLM2 step's matrices alternated in one run, 33-35 GB/s against 30-32
// for blocks of 4 rows (and 8 no faster than 4), where a plain read gives
// 36-37.
#[cfg(target_arch = "x86_64")]
kernel!(
    avx2,
    ["avx2", "fma"],
    __m256,
    8,
    _mm256_setzero_ps,
    _mm256_add_ps,
    _mm256_loadu_ps,
    _mm256_fmadd_ps,
    super::sum256,
    [4, 4, 3, 2, 2, 2, 1, 1],
    true
);

/// The sum of a vector's 8 lanes.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn sum256(v: std::arch::x86_64::__m256) -> f32 {
    use std::arch::x86_64::*;
    let quad = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let pair = _mm_add_ps(quad, _mm_movehl_ps(quad, quad));
    _mm_cvtss_f32(_mm_add_ss(pair, _mm_shuffle_ps::<1>(pair, pair)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn max_diff(a: &Tensor, b: &Tensor) -> f64 {
        (a - b).abs().max().double_value(&[])
    }

    #[test]
    fn matches_libtorch_for_every_decode_batch_size() {
        tch::manual_seed(0);
        // 96 inputs take the AVX-512 or AVX2 kernel where there is one; 97
        // the one-row fallback (or libtorch, for more rows).
        for in_dim in [96, 97] {
            let w = Tensor::randn([300, in_dim], (Kind::Float, Device::Cpu));
            for rows in 1..=MAX_ROWS {
                let x = Tensor::randn([rows, 1, in_dim], (Kind::Float, Device::Cpu));
                let reference = x.linear(&w, None::<Tensor>);
                let Some(fast) = linear(&x, &w) else {
                    assert!(rows > 1, "one row is always taken");
                    continue;
                };
                assert_eq!(fast.size(), reference.size());
                let diff = max_diff(&fast, &reference);
                assert!(diff < 1e-4, "{rows} x {in_dim}: max diff {diff}");
            }
        }
    }

    #[cfg(target_arch = "x86_64")]
    type Kernel = fn(&[f32], &mut [(&[f32], &mut [f32], usize)], usize, usize);

    /// `kernel`, for every row count: output rows that do not divide evenly
    /// among the tasks (nor into blocks of `R`), each entry against a plain
    /// sum. A kernel this CPU cannot run is reported skipped.
    #[cfg(target_arch = "x86_64")]
    #[track_caller]
    fn splits_its_rows_without_gaps_or_overlaps(
        name: &str,
        usable: fn(usize) -> bool,
        kernel: Kernel,
    ) {
        let n = 1000 + 7;
        // Input counts whose vector chunks are and are not a multiple of
        // the one-input path's four accumulators (those of the kernel's
        // vector width: 32 and 48 for every kernel).
        let ks: Vec<usize> = [32, 40, 48, 56]
            .into_iter()
            .filter(|&k| usable(k))
            .collect();
        if ks.is_empty() {
            crate::skip::skip(&format!("the {name} kernel does not run on this CPU"));
            return;
        }
        for k in ks {
            let w: Vec<f32> = (0..n * k).map(|i| (i % 5) as f32 * 0.5).collect();
            for m in 1..=MAX_ROWS as usize {
                let x: Vec<f32> = (0..m * k).map(|i| (i % 7) as f32 - 3.0).collect();
                let mut y = vec![f32::NAN; m * n];
                kernel(&x, &mut [(&w, &mut y, n)], m, k);
                for r in 0..m {
                    for o in 0..n {
                        let want: f32 = (0..k).map(|j| x[r * k + j] * w[o * k + j]).sum();
                        let got = y[r * n + o];
                        assert!((got - want).abs() < 1e-3, "{name} k {k}: y[{r}, {o}]");
                    }
                }
            }
        }
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn the_avx512_kernel_splits_its_rows_without_gaps_or_overlaps() {
        splits_its_rows_without_gaps_or_overlaps("avx512", avx512::usable, avx512::linear);
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn the_avx2_kernel_splits_its_rows_without_gaps_or_overlaps() {
        splits_its_rows_without_gaps_or_overlaps("avx2", avx2::usable, avx2::linear);
    }

    /// Several weights in one call give what one call each gives, also
    /// where a task's range crosses from one weight into the next.
    #[test]
    fn many_weights_in_one_call_match_one_call_each() {
        let k = 32;
        let m = if covers(3, k) { 3 } else { 1 };
        let x: Vec<f32> = (0..m * k).map(|i| (i % 9) as f32 - 4.0).collect();
        let sizes = [70usize, 5, 131];
        let ws: Vec<Vec<f32>> = sizes
            .iter()
            .map(|&n| (0..n * k).map(|i| (i % 11) as f32 * 0.25).collect())
            .collect();
        let mut one: Vec<Vec<f32>> = sizes.iter().map(|&n| vec![0.0; m * n]).collect();
        for ((w, y), &n) in ws.iter().zip(&mut one).zip(&sizes) {
            rows(&x, w, y, m, n, k);
        }
        let mut many: Vec<Vec<f32>> = sizes.iter().map(|&n| vec![f32::NAN; m * n]).collect();
        let mut outs: Vec<(&[f32], &mut [f32], usize)> = ws
            .iter()
            .zip(many.iter_mut())
            .zip(&sizes)
            .map(|((w, y), &n)| (w.as_slice(), y.as_mut_slice(), n))
            .collect();
        rows_many(&x, &mut outs, m, k);
        assert_eq!(one, many);
    }

    #[test]
    fn declines_what_it_does_not_cover() {
        let w = Tensor::randn([8, 16], (Kind::Float, Device::Cpu));
        let x = Tensor::randn([MAX_ROWS + 1, 16], (Kind::Float, Device::Cpu));
        assert!(linear(&x, &w).is_none(), "a prefill's rows");
        assert!(linear(&x.narrow(0, 0, 2).to_kind(Kind::BFloat16), &w).is_none());
        let strided = Tensor::randn([16, 2], (Kind::Float, Device::Cpu)).transpose(0, 1);
        assert!(linear(&strided, &w).is_none(), "a non-contiguous input");
        assert!(linear(&Tensor::randn([2, 5], (Kind::Float, Device::Cpu)), &w).is_none());
    }
}
