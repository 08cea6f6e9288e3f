//! The autocast shim calls the real ATen functions (runs without a GPU:
//! the CUDA autocast dtype is plain per-thread state in libtorch_cpu).

use agl_rl::autocast::{cuda_autocast_dtype, with_bf16_autocast};
use tch::Kind;

#[test]
fn bf16_autocast_sets_the_cuda_dtype_and_restores_it() {
    // ATen's default; `tch::autocast` alone leaves it there.
    assert_eq!(cuda_autocast_dtype(), Some(Kind::Half));
    let inside = with_bf16_autocast(true, cuda_autocast_dtype);
    assert_eq!(inside, Some(Kind::BFloat16));
    assert_eq!(cuda_autocast_dtype(), Some(Kind::Half));
}

#[test]
fn the_dtype_is_restored_when_the_region_panics() {
    let caught = std::panic::catch_unwind(|| {
        with_bf16_autocast::<()>(false, || panic!("inside the region"))
    });
    assert!(caught.is_err());
    assert_eq!(cuda_autocast_dtype(), Some(Kind::Half));
}
