//! The process heap's policy for a training process: keep large freed
//! tensor blocks for the next step ([`reuse_freed_blocks`], the default),
//! or hand freed memory back to the system (`[train]
//! release_freed_memory`).
//!
//! glibc keeps memory a step frees for the next allocations and, after a
//! large block is freed, raises the size from which blocks get pages of
//! their own (its dynamic mmap threshold, up to 32 MiB). A training step
//! allocates and frees many tensors of many sizes, so the heap fragments
//! and the resident set stays near the high-water mark of every step
//! before it: on the 1.5B LoRA bench (lean), 0.19x of the base weights
//! against 0.13x with this policy. Fixing the threshold at 1 MiB gives
//! every tensor-sized block pages of its own, returned when freed, for
//! more page faults (the bench's step 8.0 s -> 11.2 s).

use std::marker::PhantomData;
use std::sync::atomic::{AtomicBool, Ordering};

/// Allocations from this size get pages of their own.
const MMAP_THRESHOLD: i32 = 1 << 20;

/// Set once `release_freed_memory` took effect: memory goes back, so no
/// block is kept for reuse.
static RELEASING: AtomicBool = AtomicBool::new(false);

unsafe extern "C" {
    // csrc/block_cache.cpp
    fn agl_block_cache_install() -> bool;
    fn agl_block_cache_enter();
    fn agl_block_cache_exit();
    fn agl_block_cache_trim() -> usize;
    fn agl_block_cache_cached() -> usize;
}

/// Gives every allocation of 1 MiB or more pages of its own, returned to
/// the system when freed. Process-wide; true where it took effect (glibc).
pub fn release_freed_memory() -> bool {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // glibc's malloc.h.
        const M_MMAP_THRESHOLD: i32 = -3;
        unsafe extern "C" {
            fn mallopt(param: i32, value: i32) -> i32;
        }
        // SAFETY: mallopt only changes the allocator's tuning; blocks
        // already allocated keep where they are.
        let released = unsafe { mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1 };
        if released {
            RELEASING.store(true, Ordering::Relaxed);
            trim_kept_blocks();
        }
        released
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    {
        false
    }
}

/// While alive, libtorch's CPU tensors of 1 MiB and more that this thread
/// allocates come from blocks kept when earlier ones were freed
/// (`csrc/block_cache.cpp`): a training step's logits, activations and
/// gradients reuse the last step's pages instead of faulting in fresh
/// zeroed ones (glibc unmaps blocks of 32 MiB and more when they are freed,
/// and a thread's own arena any block its heaps cannot hold). The blocks
/// kept are capped at a quarter of the machine's memory. Nests; tied to
/// its thread. A no-op once [`release_freed_memory`] took effect.
pub struct BlockReuse {
    entered: bool,
    // The scope is the thread's: leaving it on another would be wrong.
    _thread: PhantomData<*const ()>,
}

pub fn reuse_freed_blocks() -> BlockReuse {
    // SAFETY: installing swaps libtorch's CPU allocator once, for one that
    // hands every block it does not keep to the previous allocator;
    // entering bumps a thread-local counter.
    let entered = !RELEASING.load(Ordering::Relaxed) && unsafe { agl_block_cache_install() };
    if entered {
        unsafe { agl_block_cache_enter() };
    }
    BlockReuse {
        entered,
        _thread: PhantomData,
    }
}

impl Drop for BlockReuse {
    fn drop(&mut self) {
        if self.entered {
            // SAFETY: decrements the counter this scope incremented, on the
            // same thread (`BlockReuse` is not Send).
            unsafe { agl_block_cache_exit() };
        }
    }
}

/// Unmaps every block kept for reuse; the bytes it gave back.
pub fn trim_kept_blocks() -> usize {
    // SAFETY: takes the cache's lock; kept blocks belong to no tensor.
    unsafe { agl_block_cache_trim() }
}

/// Bytes kept for reuse now.
pub fn kept_block_bytes() -> usize {
    // SAFETY: reads a counter under the cache's lock.
    unsafe { agl_block_cache_cached() }
}
