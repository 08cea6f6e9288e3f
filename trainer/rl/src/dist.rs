//! A libtorch c10d process group: rendezvous through c10d's `TCPStore`,
//! collectives on Gloo (CPU tensors) or NCCL (CUDA tensors, the `nccl`
//! feature), through the C++ shim in `csrc/c10d.cpp`. The data-parallel
//! trainer ([`crate::data_parallel`]) is its user.
//!
//! Every collective blocks until done on this rank and returns an error
//! (never panics) when a peer fails or the group's timeout passes: a rank
//! that died surfaces here as `Err`.

use std::ffi::{CString, c_char, c_int};
use std::time::Duration;

use tch::{Device, Kind, Tensor};

#[repr(C)]
struct AglGroup {
    _private: [u8; 0],
}

unsafe extern "C" {
    fn agl_c10d_new(
        host: *const c_char,
        port: c_int,
        rank: c_int,
        size: c_int,
        timeout_ms: i64,
        rendezvous_ms: i64,
        backend: c_int,
        err: *mut c_char,
        err_len: usize,
    ) -> *mut AglGroup;
    fn agl_c10d_free(group: *mut AglGroup);
    fn agl_c10d_all_reduce(
        group: *mut AglGroup,
        tensor: *mut torch_sys::C_tensor,
        op: c_int,
        err: *mut c_char,
        err_len: usize,
    ) -> c_int;
    fn agl_c10d_broadcast(
        group: *mut AglGroup,
        tensor: *mut torch_sys::C_tensor,
        root: c_int,
        err: *mut c_char,
        err_len: usize,
    ) -> c_int;
    fn agl_c10d_barrier(group: *mut AglGroup, err: *mut c_char, err_len: usize) -> c_int;
}

#[derive(Debug, thiserror::Error)]
pub enum DistError {
    #[error("c10d: {0}")]
    C10d(String),
    #[error("invalid process group setting: {0}")]
    Config(String),
    #[error(transparent)]
    Torch(#[from] tch::TchError),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// CPU tensors, TCP between ranks.
    Gloo,
    /// CUDA tensors; needs the `nccl` feature and one GPU per rank.
    Nccl,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReduceOp {
    Sum,
    Max,
    Min,
}

/// Where and how ranks meet: torchrun's `MASTER_ADDR` / `MASTER_PORT`,
/// `RANK`, `WORLD_SIZE`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupConfig {
    pub master_addr: String,
    pub master_port: u16,
    pub rank: usize,
    pub world_size: usize,
    pub backend: Backend,
    /// NCCL: the CUDA device of this rank (torchrun's `LOCAL_RANK`).
    pub local_rank: usize,
    /// Every collective gives up after this long (a rank that died is
    /// found at once: its connections close).
    pub timeout: Duration,
    /// Joining gives up when not every rank arrived within this.
    pub rendezvous_timeout: Duration,
}

impl GroupConfig {
    /// The group torchrun's variables describe, or `None` when `WORLD_SIZE`
    /// is unset (a single process).
    pub fn from_env(
        backend: Backend,
        timeout: Duration,
        rendezvous_timeout: Duration,
    ) -> Result<Option<Self>, DistError> {
        let Ok(world) = std::env::var("WORLD_SIZE") else {
            return Ok(None);
        };
        let num = |name: &str, value: &str| {
            value
                .parse::<usize>()
                .map_err(|_| DistError::Config(format!("{name}={value} is not a number")))
        };
        let world_size = num("WORLD_SIZE", &world)?;
        let rank = num(
            "RANK",
            &std::env::var("RANK").unwrap_or_else(|_| "0".into()),
        )?;
        let master_addr = std::env::var("MASTER_ADDR").unwrap_or_else(|_| "127.0.0.1".into());
        let port = std::env::var("MASTER_PORT").unwrap_or_else(|_| "29500".into());
        let master_port = port
            .parse()
            .map_err(|_| DistError::Config(format!("MASTER_PORT={port} is not a port")))?;
        let local_rank = match std::env::var("LOCAL_RANK") {
            Ok(v) => num("LOCAL_RANK", &v)?,
            Err(_) => rank,
        };
        let cfg = GroupConfig {
            master_addr,
            master_port,
            rank,
            world_size,
            backend,
            local_rank,
            timeout,
            rendezvous_timeout,
        };
        cfg.check()?;
        Ok(Some(cfg))
    }

    fn check(&self) -> Result<(), DistError> {
        if self.world_size == 0 || self.rank >= self.world_size {
            return Err(DistError::Config(format!(
                "rank {} of world size {}",
                self.rank, self.world_size
            )));
        }
        Ok(())
    }
}

/// One rank's membership of a c10d process group.
pub struct ProcessGroup {
    raw: *mut AglGroup,
    rank: usize,
    world_size: usize,
    device: Device,
}

// The backend is used from one thread at a time (`&mut self` for
// collectives); c10d backends may be moved between threads.
unsafe impl Send for ProcessGroup {}

const ERR_LEN: usize = 1024;

fn millis(d: Duration) -> i64 {
    d.as_millis().min(i64::MAX as u128) as i64
}

fn call(f: impl FnOnce(*mut c_char) -> bool) -> Result<(), DistError> {
    let mut err = vec![0 as c_char; ERR_LEN];
    if f(err.as_mut_ptr()) {
        return Ok(());
    }
    // SAFETY: the shim writes a NUL-terminated message of < ERR_LEN bytes.
    let msg = unsafe { std::ffi::CStr::from_ptr(err.as_ptr()) };
    Err(DistError::C10d(msg.to_string_lossy().trim().to_string()))
}

impl ProcessGroup {
    /// Joins the group: rank 0 serves the `TCPStore` at `master_addr:
    /// master_port`, every rank waits until all `world_size` arrived.
    pub fn join(cfg: &GroupConfig) -> Result<Self, DistError> {
        cfg.check()?;
        let host = CString::new(cfg.master_addr.as_str())
            .map_err(|_| DistError::Config("MASTER_ADDR holds a NUL".into()))?;
        let mut raw = std::ptr::null_mut();
        call(|err| {
            // SAFETY: valid C strings and an ERR_LEN buffer; the shim
            // catches every C++ exception.
            raw = unsafe {
                agl_c10d_new(
                    host.as_ptr(),
                    c_int::from(cfg.master_port),
                    cfg.rank as c_int,
                    cfg.world_size as c_int,
                    millis(cfg.timeout),
                    millis(cfg.rendezvous_timeout),
                    match cfg.backend {
                        Backend::Gloo => 0,
                        Backend::Nccl => 1,
                    },
                    err,
                    ERR_LEN,
                )
            };
            !raw.is_null()
        })?;
        Ok(ProcessGroup {
            raw,
            rank: cfg.rank,
            world_size: cfg.world_size,
            device: match cfg.backend {
                Backend::Gloo => Device::Cpu,
                Backend::Nccl => Device::Cuda(cfg.local_rank),
            },
        })
    }

    pub fn rank(&self) -> usize {
        self.rank
    }

    pub fn world_size(&self) -> usize {
        self.world_size
    }

    /// Where this group's tensors live: CPU for Gloo, this rank's GPU for
    /// NCCL.
    pub fn device(&self) -> Device {
        self.device
    }

    /// In place: every rank ends with the elementwise reduction.
    pub fn all_reduce(&mut self, tensor: &mut Tensor, op: ReduceOp) -> Result<(), DistError> {
        let op = match op {
            ReduceOp::Sum => 0,
            ReduceOp::Max => 1,
            ReduceOp::Min => 2,
        };
        let raw = self.raw;
        // SAFETY: `raw` is live for `self`'s lifetime, the tensor pointer
        // for the call's.
        call(|err| unsafe { agl_c10d_all_reduce(raw, tensor.as_mut_ptr(), op, err, ERR_LEN) == 0 })
    }

    /// In place: every rank ends with `root`'s tensor.
    pub fn broadcast(&mut self, tensor: &mut Tensor, root: usize) -> Result<(), DistError> {
        let raw = self.raw;
        // SAFETY: as in `all_reduce`.
        call(|err| unsafe {
            agl_c10d_broadcast(raw, tensor.as_mut_ptr(), root as c_int, err, ERR_LEN) == 0
        })
    }

    pub fn barrier(&mut self) -> Result<(), DistError> {
        let raw = self.raw;
        // SAFETY: as in `all_reduce`.
        call(|err| unsafe { agl_c10d_barrier(raw, err, ERR_LEN) == 0 })
    }

    /// `root`'s bytes on every rank (others pass anything, e.g. empty): the
    /// length first, then the bytes, as two broadcasts.
    pub fn broadcast_bytes(&mut self, bytes: &[u8], root: usize) -> Result<Vec<u8>, DistError> {
        let mut len = Tensor::from_slice(&[bytes.len() as i64]).to_device(self.device);
        self.broadcast(&mut len, root)?;
        let len = i64::try_from(&len.to_device(Device::Cpu))? as usize;
        let mut data = if self.rank == root {
            Tensor::from_slice(bytes).to_device(self.device)
        } else {
            Tensor::zeros([len as i64], (Kind::Uint8, self.device))
        };
        if len > 0 {
            self.broadcast(&mut data, root)?;
        }
        Ok(Vec::<u8>::try_from(&data.to_device(Device::Cpu))?)
    }
}

impl Drop for ProcessGroup {
    fn drop(&mut self) {
        // SAFETY: created by `agl_c10d_new`, freed once.
        unsafe { agl_c10d_free(self.raw) }
    }
}
