//! agl-rl: batches, the RL step, AdamW, checkpoints, data parallel, LoRA
//! training, and the CUDA checks of model, engine and step; parity with
//! PyTorch and peft. One test binary (each links libtorch).

mod adamw;
mod autocast;
mod checkpoint;
#[allow(dead_code)] // each module uses a subset
#[path = "../../../tests/common.rs"]
mod common;
mod correction;
mod cuda;
mod data_parallel;
mod kl_reference;
mod lora_parity;
mod memory;
mod rl_batch;
mod rl_step;
mod schedule;
#[path = "../../benches/common/schedule_sim.rs"]
mod schedule_sim;
