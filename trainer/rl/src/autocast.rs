//! bf16 autocast on CUDA.
//!
//! `tch::autocast` only switches CUDA autocast on; the dtype stays ATen's
//! default, f16, and tch has no setter. f16 without loss scaling can
//! underflow gradients, so the training forward must run in bf16. A small
//! C++ shim (`csrc/autocast.cpp`, built by `build.rs`) reads and sets ATen's
//! CUDA autocast dtype.
//!
//! ATen keeps that dtype per thread (a `thread_local` array in
//! `autocast_mode.cpp`; autograd copies it into its own worker threads), so
//! it is set on the calling thread around every region, not once per
//! process, and restored afterwards.

use tch::Kind;

unsafe extern "C" {
    fn agl_cuda_autocast_dtype() -> i32;
    fn agl_set_cuda_autocast_dtype(dtype: i32);
}

/// `c10::ScalarType` codes of the dtypes CUDA autocast accepts.
const HALF: i32 = 5;
const FLOAT: i32 = 6;
const BFLOAT16: i32 = 15;

/// Runs `f` under `tch::autocast(enabled, ..)` with the CUDA autocast dtype
/// set to bf16 on this thread; the previous dtype is restored afterwards,
/// also when `f` panics.
pub fn with_bf16_autocast<T>(enabled: bool, f: impl FnOnce() -> T) -> T {
    struct Restore(i32);
    impl Drop for Restore {
        fn drop(&mut self) {
            // SAFETY: `self.0` was read from ATen, so it is a valid dtype.
            unsafe { agl_set_cuda_autocast_dtype(self.0) }
        }
    }
    // SAFETY: plain getters/setters of a thread-local array in ATen; BFloat16
    // is a dtype CUDA autocast supports.
    let _restore = Restore(unsafe { agl_cuda_autocast_dtype() });
    unsafe { agl_set_cuda_autocast_dtype(BFLOAT16) };
    tch::autocast(enabled, f)
}

/// This thread's CUDA autocast dtype (f16 unless set); `None` for a code
/// CUDA autocast does not use.
pub fn cuda_autocast_dtype() -> Option<Kind> {
    // SAFETY: a plain getter of a thread-local array in ATen.
    match unsafe { agl_cuda_autocast_dtype() } {
        HALF => Some(Kind::Half),
        FLOAT => Some(Kind::Float),
        BFLOAT16 => Some(Kind::BFloat16),
        _ => None,
    }
}
