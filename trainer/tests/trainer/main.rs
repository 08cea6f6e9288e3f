//! agl-trainer: model, KV cache, engine, RL step, AdamW, checkpoints, parity
//! with transformers and PyTorch. One test binary (each links libtorch).

mod adamw;
mod autocast;
mod checkpoint;
#[allow(dead_code)] // each module uses a subset
mod common;
mod correction;
mod cuda;
mod data_parallel;
mod engine;
mod hf_parity;
mod kl_reference;
mod kv_cache;
mod lora_parity;
mod memory;
mod rl_batch;
mod rl_step;
mod schedule;
mod scoring;
mod weights;
