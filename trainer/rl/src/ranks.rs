//! Data-parallel trainer ranks (`[train] world_size`): rank 0 is the
//! trainer thread ([`crate::trainer`]) of `agl run` / `agl train`; ranks
//! 1.. are processes running [`run_rank`] (`agl trainer-rank`) that it
//! starts on this machine ([`DataParallel::rank_args`]), or that a launcher
//! started anywhere with torchrun's variables (`RANK`, `WORLD_SIZE`,
//! `LOCAL_RANK`, `MASTER_ADDR`, `MASTER_PORT`).
//!
//! Everything travels over the c10d group itself: after the rendezvous
//! rank 0 broadcasts a [`RankSpec`] (what to load), then one
//! [`RankCommand`] per update, checkpoint or restore, each as postcard
//! bytes; every rank then runs the same collective step. Only rank 0 talks
//! to the engine, the store and the disk (a restore excepted: each rank
//! reads the checkpoint, so on several machines the run folder must be
//! shared).

use std::path::PathBuf;
use std::process::{Child, Command};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tch::{Device, Kind};

use crate::checkpoint;
use crate::data_parallel::gather_optimizer_state;
use crate::dist::{Backend, GroupConfig, ProcessGroup};
use crate::trainer_error::TrainerError;
use crate::{
    AdamWConfig, LrSchedule, RlOptimizer, StepConfig, UpdateBatch, train_step, weights_hash,
};
use agl_model::{LoraConfig, Model};

type Result<T, E = TrainerError> = std::result::Result<T, E>;

/// The group's shape as `[train]` asks for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DataParallel {
    pub world_size: usize,
    pub zero1: bool,
    /// 0: a free port (ranks on this machine only).
    pub port: u16,
    pub timeout: Duration,
    /// The arguments that make this program run [`run_rank`] (`agl`:
    /// `trainer-rank`): ranks started here are this executable with them.
    pub rank_args: &'static [&'static str],
}

/// What every rank loads; rank 0 sends it after the rendezvous.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RankSpec {
    pub model_dir: PathBuf,
    pub bf16: bool,
    pub adamw: AdamWConfig,
    pub schedule: LrSchedule,
    pub lora: Option<LoraConfig>,
    pub zero1: bool,
    pub release_freed_memory: bool,
}

#[derive(Debug, Serialize, Deserialize)]
pub enum RankCommand {
    Train(Box<UpdateBatch>, StepConfig),
    /// ZeRO-1: every rank's optimizer state to rank 0, for its checkpoint.
    GatherState,
    Restore(PathBuf),
    Stop,
}

/// Waiting for every rank to arrive: ranks this process starts are up in
/// seconds; a launcher's may start minutes apart.
const LOCAL_RENDEZVOUS: Duration = Duration::from_secs(120);
const LAUNCHER_RENDEZVOUS: Duration = Duration::from_secs(900);

/// Gloo on CPU, NCCL when this rank trains on a GPU: ranks decide alike on
/// machines alike.
fn backend(device: Device) -> Backend {
    match device {
        Device::Cuda(_) => Backend::Nccl,
        _ => Backend::Gloo,
    }
}

/// Rank 0's side of the group: the membership, and the ranks it started.
pub struct Dist {
    pub group: ProcessGroup,
    children: Vec<(usize, Child)>,
    pub zero1: bool,
}

impl Dist {
    /// Joins as rank 0 (starting ranks 1.. here unless a launcher did) and
    /// sends every rank the spec.
    pub fn start(dp: &DataParallel, device: Device, spec: &RankSpec) -> Result<Dist> {
        let launcher = GroupConfig::from_env(backend(device), dp.timeout, LAUNCHER_RENDEZVOUS)?;
        let (cfg, children) = match launcher {
            Some(cfg) => {
                if cfg.rank != 0 {
                    return Err(TrainerError::Group(format!(
                        "the trainer thread is rank 0, but RANK={}",
                        cfg.rank
                    )));
                }
                if cfg.world_size != dp.world_size {
                    return Err(TrainerError::Group(format!(
                        "WORLD_SIZE={} but train.world_size = {}",
                        cfg.world_size, dp.world_size
                    )));
                }
                (cfg, Vec::new())
            }
            None => {
                let port = match dp.port {
                    0 => free_port()?,
                    p => p,
                };
                let cfg = GroupConfig {
                    master_addr: "127.0.0.1".into(),
                    master_port: port,
                    rank: 0,
                    world_size: dp.world_size,
                    backend: backend(device),
                    local_rank: 0,
                    timeout: dp.timeout,
                    rendezvous_timeout: LOCAL_RENDEZVOUS,
                };
                let children = (1..dp.world_size)
                    .map(|rank| spawn_rank(&cfg, dp.rank_args, rank).map(|c| (rank, c)))
                    .collect::<Result<Vec<_>>>()?;
                (cfg, children)
            }
        };
        let mut dist = Dist {
            group: ProcessGroup::join(&cfg)?,
            children,
            zero1: spec.zero1,
        };
        let bytes = postcard::to_stdvec(spec)?;
        dist.group.broadcast_bytes(&bytes, 0)?;
        tracing::info!(
            world_size = cfg.world_size,
            backend = ?cfg.backend,
            zero1 = spec.zero1,
            "data-parallel trainer ranks joined"
        );
        Ok(dist)
    }

    /// Sends every rank its next command.
    pub fn send(&mut self, command: &RankCommand) -> Result<()> {
        let bytes = postcard::to_stdvec(command)?;
        self.group.broadcast_bytes(&bytes, 0)?;
        Ok(())
    }

    /// `err` of a collective, with what became of the ranks this process
    /// started (a rank that died is the usual cause).
    pub fn explain(&mut self, err: TrainerError) -> TrainerError {
        // A rank that died closes its connections before its process is
        // reaped: give it a moment.
        std::thread::sleep(Duration::from_millis(200));
        let dead: Vec<String> = self
            .children
            .iter_mut()
            .filter_map(|(rank, child)| match child.try_wait() {
                Ok(Some(status)) => Some(format!("rank {rank} exited ({status})")),
                _ => None,
            })
            .collect();
        let ranks = if dead.is_empty() {
            "a data-parallel collective failed".to_string()
        } else {
            format!("data-parallel trainer {}", dead.join(", "))
        };
        TrainerError::Collective {
            ranks,
            source: Box::new(err),
        }
    }
}

impl Drop for Dist {
    fn drop(&mut self) {
        // Ranks still listening end cleanly; then none outlives the run.
        let _ = self.send(&RankCommand::Stop);
        for (rank, child) in &mut self.children {
            let deadline = std::time::Instant::now() + Duration::from_secs(10);
            loop {
                match child.try_wait() {
                    Ok(Some(_)) => break,
                    Ok(None) if std::time::Instant::now() < deadline => {
                        std::thread::sleep(Duration::from_millis(50))
                    }
                    _ => {
                        tracing::warn!(rank, "trainer rank did not stop: killing it");
                        let _ = child.kill();
                        let _ = child.wait();
                        break;
                    }
                }
            }
        }
    }
}

fn free_port() -> Result<u16> {
    let io = |source| TrainerError::Io {
        what: "picking a free port".into(),
        source,
    };
    let listener = std::net::TcpListener::bind("127.0.0.1:0").map_err(io)?;
    Ok(listener.local_addr().map_err(io)?.port())
}

/// This executable with `args` (it then runs [`run_rank`]) for `rank` of
/// `cfg`'s group, with torchrun's variables; its output goes where this
/// process's does.
fn spawn_rank(cfg: &GroupConfig, args: &[&str], rank: usize) -> Result<Child> {
    let exe = std::env::current_exe().map_err(|source| TrainerError::Io {
        what: "locating this executable".into(),
        source,
    })?;
    Command::new(exe)
        .args(args)
        .env("RANK", rank.to_string())
        .env("LOCAL_RANK", rank.to_string())
        .env("WORLD_SIZE", cfg.world_size.to_string())
        .env("MASTER_ADDR", &cfg.master_addr)
        .env("MASTER_PORT", cfg.master_port.to_string())
        .env("AGL_DIST_TIMEOUT_SECS", cfg.timeout.as_secs().to_string())
        .spawn()
        .map_err(|source| TrainerError::Io {
            what: format!("starting trainer rank {rank}"),
            source,
        })
}

/// One rank > 0 (`agl trainer-rank`), until rank 0 says stop (or fails).
pub fn run_rank() -> Result<()> {
    let timeout = std::env::var("AGL_DIST_TIMEOUT_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .map(Duration::from_secs)
        .unwrap_or(Duration::from_secs(3600));
    let cuda = tch::Cuda::is_available();
    let probe = if cuda { Device::Cuda(0) } else { Device::Cpu };
    let cfg =
        GroupConfig::from_env(backend(probe), timeout, LAUNCHER_RENDEZVOUS)?.ok_or_else(|| {
            TrainerError::Group(
            "a trainer rank needs torchrun's variables: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT"
                .into(),
        )
        })?;
    if cfg.rank == 0 {
        return Err(TrainerError::Group(
            "rank 0 is `agl run` / `agl train` itself, not `agl trainer-rank`".into(),
        ));
    }
    let rank = cfg.rank;
    let at_rank = |source: TrainerError| TrainerError::Rank {
        rank,
        source: Box::new(source),
    };
    let device = if cuda {
        Device::Cuda(cfg.local_rank)
    } else {
        Device::Cpu
    };
    let mut group = ProcessGroup::join(&cfg)?;
    let spec: RankSpec = postcard::from_bytes(&group.broadcast_bytes(&[], 0)?)?;
    if spec.release_freed_memory {
        crate::memory::release_freed_memory();
    }
    let kind = if spec.bf16 {
        Kind::BFloat16
    } else {
        Kind::Float
    };
    let mut model = Model::load(&spec.model_dir, kind, device).map_err(|source| {
        at_rank(TrainerError::Load {
            what: "the policy",
            path: spec.model_dir.clone(),
            source,
        })
    })?;
    if let Some(lora) = &spec.lora {
        model.add_lora(lora)?;
    }
    let mut opt = if spec.zero1 {
        RlOptimizer::new_sharded(&model, spec.adamw, spec.schedule, cfg.rank, cfg.world_size)?
    } else {
        RlOptimizer::new(&model, spec.adamw, spec.schedule)?
    };
    tracing::info!(rank = cfg.rank, ?device, "trainer rank ready");
    loop {
        let bytes = group
            .broadcast_bytes(&[], 0)
            .map_err(|e| at_rank(e.into()))?;
        match postcard::from_bytes::<RankCommand>(&bytes)? {
            RankCommand::Train(batch, step) => {
                train_step(&model, &mut opt, &batch, &step, &mut group)
                    .map_err(|e| at_rank(e.into()))?;
            }
            RankCommand::GatherState => {
                gather_optimizer_state(&model, &opt, &mut group)?;
            }
            RankCommand::Restore(path) => {
                checkpoint::load_checkpoint(&path, &model, &mut opt)
                    .map_err(|e| at_rank(e.into()))?;
            }
            RankCommand::Stop => {
                tracing::info!(
                    rank = cfg.rank,
                    weights_hash = format!("{:016x}", weights_hash(&model)),
                    "trainer rank stopped"
                );
                return Ok(());
            }
        }
    }
}
