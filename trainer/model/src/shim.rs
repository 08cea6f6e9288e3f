//! Calling agl's C++ shims (`csrc/`): an entry point returns a tensor it
//! allocated with `new`, or null with a NUL-terminated message in the
//! buffer it was handed; nothing throws across the boundary.

use std::ffi::{CStr, c_char};

use tch::Tensor;

/// Runs `entry` with a message buffer: its tensor, owned, or its message.
pub(super) fn tensor_or_message(
    entry: impl FnOnce(*mut c_char, usize) -> *mut torch_sys::C_tensor,
) -> Result<Tensor, String> {
    let mut err = [0 as c_char; 512];
    let y = entry(err.as_mut_ptr(), err.len());
    if y.is_null() {
        // SAFETY: the shim wrote a NUL-terminated string into `err`.
        return Err(unsafe { CStr::from_ptr(err.as_ptr()) }
            .to_string_lossy()
            .into_owned());
    }
    // SAFETY: a fresh tensor from the shim, which tch's `Tensor` owns and
    // frees.
    Ok(unsafe { Tensor::from_ptr(y) })
}
