//! Decode throughput of agl's engine vs transformers `generate` on
//! SmolLM2-135M-Instruct, plus peak memory. Prints a table.
//!
//! `cargo bench -p agl-engine --bench engine` with `AGL_VENV` set: f32 and
//! bf16 on CPU (same thread count as transformers) at 1 and 8 concurrent
//! requests, against the memory-bandwidth bound measured in the same run (a
//! buffer the weights' size read as many times as a run has decode steps,
//! before each batch-1 run, so both are timed over alike windows of the
//! shared machine; a batch-1 step reads every weight once, so `bandwidth /
//! weight bytes` is the most tokens/s it can give; held against the decode
//! steps alone, first token to last, where the "1 req" column also counts
//! the prompt's prefill, as transformers' `generate` is timed), with issue
//! 35's limits; the model folder is `$AGL_SMOLLM2` or `~/.cache/agl/models/smollm2-135m-instruct`
//! (built by `host/agl/tests/e2e/engine_server.rs`'s `smollm2_dir`).
//!
//! `AGL_DEVICE=cuda`: f32 and bf16 on the GPU at 1, 8 and 32 concurrent
//! requests. `AGL_RANDOM_MODEL=1` (or no model folder): a randomly
//! initialised model of SmolLM2-135M's shape and a fixed synthetic prompt
//! (decode speed does not depend on the weight values). `AGL_SKIP_HF=1`:
//! no transformers comparison; `AGL_HF_SCRIPT`: where hf_generate.py is.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use agl_engine::{EngineConfig, EngineEvent, EngineHandle, Request, SamplingParams};
use agl_model::{Model, ModelConfig};
use rayon::prelude::*;
use serde_json::{Value, json};
use tch::{Device, Kind, Tensor};

const NEW_TOKENS: usize = 64;

fn model_dir() -> PathBuf {
    std::env::var_os("AGL_SMOLLM2").map_or_else(
        || {
            let home = std::env::var_os("HOME").unwrap_or_else(|| "/root".into());
            PathBuf::from(home).join(".cache/agl/models/smollm2-135m-instruct")
        },
        PathBuf::from,
    )
}

/// SmolLM2-135M-Instruct's config.json, minus the token ids: without an
/// `eos_token_id` nothing stops a random model's greedy decode early.
fn smollm2_config() -> Value {
    json!({
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": 576,
        "intermediate_size": 1536,
        "num_hidden_layers": 30,
        "num_attention_heads": 9,
        "num_key_value_heads": 3,
        "head_dim": 64,
        "hidden_act": "silu",
        "rms_norm_eps": 1e-5,
        "rope_theta": 100000.0,
        "max_position_embeddings": 8192,
        "vocab_size": 49152,
        "tie_word_embeddings": true,
        "attention_bias": false,
        "mlp_bias": false,
    })
}

/// A fixed 40-token prompt for the random model.
fn synthetic_prompt() -> Vec<u32> {
    (0..40u32).map(|i| (i * 7919 + 17) % 49152).collect()
}

/// What one run of `n` concurrent requests gives, in tokens/s over all of
/// them.
#[derive(Clone, Copy)]
struct Rate {
    /// Every token over the whole run, the prompt's prefill included (as
    /// transformers' `generate` is timed).
    total: f64,
    /// Decode steps alone: the tokens after each request's first over the
    /// time from the first token to the last (time per output token, the
    /// figure a step that reads every weight once bounds).
    decode: f64,
}

/// `n` concurrent greedy requests of `NEW_TOKENS` each.
fn run(engine: &EngineHandle, prompt: &[u32], n: usize) -> Rate {
    let params = SamplingParams {
        temperature: 0.0,
        max_tokens: NEW_TOKENS,
        ..SamplingParams::default()
    };
    let start = Instant::now();
    let rxs: Vec<_> = (0..n)
        .map(|_| {
            let request = Request {
                prompt_ids: prompt.to_vec(),
                params: params.clone(),
                stop_hook: None,
                constraint: None,
            };
            engine.submit(request).unwrap()
        })
        .collect();
    // Each request's (tokens, first token's time, last's), read as they come.
    let each: Vec<(usize, Instant, Instant)> = std::thread::scope(|scope| {
        let readers: Vec<_> = rxs
            .into_iter()
            .map(|mut rx| {
                scope.spawn(move || {
                    let (mut first, mut last) = (None, start);
                    while let Some(event) = rx.blocking_recv() {
                        match event {
                            EngineEvent::Token { .. } => {
                                last = Instant::now();
                                first.get_or_insert(last);
                            }
                            EngineEvent::Finished(f) => {
                                return (f.response_ids.len(), first.unwrap_or(start), last);
                            }
                        }
                    }
                    (0, start, start)
                })
            })
            .collect();
        readers.into_iter().map(|r| r.join().unwrap()).collect()
    });
    let tokens: usize = each.iter().map(|e| e.0).sum();
    let first = each.iter().map(|e| e.1).min().unwrap_or(start);
    let last = each.iter().map(|e| e.2).max().unwrap_or(start);
    Rate {
        total: tokens as f64 / start.elapsed().as_secs_f64(),
        decode: tokens.saturating_sub(n) as f64 / last.duration_since(first).as_secs_f64(),
    }
}

fn peak_rss_mb() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .map_or(0.0, |kb| kb / 1024.0)
}

/// GPU memory in use now (all processes) per nvidia-smi; NaN without it.
fn gpu_used_mb() -> f64 {
    Command::new("nvidia-smi")
        .args(["--query-gpu=memory.used", "--format=csv,noheader,nounits"])
        .output()
        .ok()
        .and_then(|o| {
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .next()?
                .trim()
                .parse()
                .ok()
        })
        .unwrap_or(f64::NAN)
}

/// transformers `generate` figures from hf_generate.py, or None when skipped.
fn hf(folder: &Path, args: &[String]) -> Option<Value> {
    if std::env::var_os("AGL_SKIP_HF").is_some() {
        println!("transformers comparison skipped (AGL_SKIP_HF set)");
        return None;
    }
    let venv = std::env::var_os("AGL_VENV").map_or_else(|| PathBuf::from(".venv"), PathBuf::from);
    // AGL_HF_SCRIPT: for a bench binary run away from its source tree.
    let script = std::env::var_os("AGL_HF_SCRIPT").map_or_else(
        || PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("benches/hf_generate.py"),
        PathBuf::from,
    );
    let out = Command::new(venv.join("bin/python"))
        .arg(script)
        .arg(folder)
        .args(args)
        .output()
        .expect("run python");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    Some(serde_json::from_slice(&out.stdout).expect("hf JSON"))
}

fn ids(v: &Value) -> Vec<u32> {
    let list = v.as_array().expect("prompt_ids");
    list.iter().map(|x| x.as_u64().unwrap() as u32).collect()
}

fn spawn(model: Model, max_seqs: usize) -> EngineHandle {
    let config = EngineConfig {
        max_seqs,
        max_len: 1024,
        weight_version: 0,
    };
    EngineHandle::spawn(model, config).unwrap()
}

/// Bytes one batch-1 decode step must read: every parameter once (a tied
/// embedding is one tensor, read whole as the LM head).
fn weight_bytes(model: &Model) -> usize {
    model
        .var_store()
        .variables()
        .values()
        .map(|t| t.numel() * t.kind().elt_size_in_bytes())
        .sum()
}

/// The machine's streaming-read bandwidth over an f32 buffer the weights'
/// size, on the engine's thread count, by two readers: libtorch's
/// vectorised multi-threaded `sum()` and a rayon read that prefetches ahead
/// as agl's decode kernel does.
struct Bound {
    buffer: Tensor,
    floats: Vec<f32>,
    pool: rayon::ThreadPool,
    bytes: usize,
}

impl Bound {
    fn new(bytes: usize) -> Self {
        let buffer = Tensor::ones([(bytes / 4) as i64], (Kind::Float, Device::Cpu));
        let _ = buffer.sum(Kind::Float).double_value(&[]); // fault the pages in
        let floats = Vec::<f32>::try_from(&buffer).unwrap();
        Self {
            buffer,
            floats,
            pool: rayon::ThreadPoolBuilder::new()
                .num_threads(usize::try_from(tch::get_num_threads()).unwrap_or(1).max(1))
                .build()
                .unwrap(),
            bytes,
        }
    }

    /// Bytes/s of each reader over `passes` reads in a row: a decode run's
    /// steps read the weights that many times, so the bound and the decode
    /// are timed over windows alike (a single short read can land in a
    /// quiet moment of a shared machine that a whole run does not).
    fn run(&self, passes: usize) -> (f64, f64) {
        let rate = |read: &dyn Fn()| {
            let t = Instant::now();
            (0..passes).for_each(|_| read());
            (passes * self.bytes) as f64 / t.elapsed().as_secs_f64()
        };
        let torch = rate(&|| {
            let _ = self.buffer.sum(Kind::Float).double_value(&[]);
        });
        let floats = &self.floats;
        let prefetched = rate(&|| {
            let total: f32 = self
                .pool
                .install(|| floats.par_chunks(1 << 16).map(prefetched_sum).sum());
            std::hint::black_box(total);
        });
        (torch, prefetched)
    }
}

/// The decode step's matmuls alone, as an f32 step of `m` sequences runs
/// them (per layer q/k/v in one parallel loop, o, gate/up in one, down;
/// then the LM head) on weights of SmolLM2's shapes, on the calling thread's
/// team as the engine's: the best of 7 passes, in bytes of weights read per
/// second. Against the bound it is the kernel's share; the decode steps'
/// own rate against it is what the rest of the step (norms, RoPE,
/// attention, the hand-offs between them) costs.
fn matmul_bandwidth(m: usize) -> f64 {
    let c = smollm2_config();
    let dim = |k: &str| c[k].as_u64().unwrap() as usize;
    let (h, inter, layers) = (
        dim("hidden_size"),
        dim("intermediate_size"),
        dim("num_hidden_layers"),
    );
    let (qd, kvd) = (
        dim("num_attention_heads") * dim("head_dim"),
        dim("num_key_value_heads") * dim("head_dim"),
    );
    let vocab = dim("vocab_size");
    // One layer's weights in order: q, k, v, o, gate, up, down.
    let sizes = [
        qd * h,
        kvd * h,
        kvd * h,
        h * qd,
        inter * h,
        inter * h,
        h * inter,
    ];
    let per_layer: usize = sizes.iter().sum();
    let weights = vec![0.01f32; layers * per_layer + vocab * h];
    let x = vec![0.5f32; m * inter.max(qd).max(h)];
    let mut y = vec![0f32; m * vocab];
    let (mut q, mut k, mut v) = (vec![0f32; m * qd], vec![0f32; m * kvd], vec![0f32; m * kvd]);
    let (mut gate, mut up) = (vec![0f32; m * inter], vec![0f32; m * inter]);
    let mut pass = || {
        for layer in weights[..layers * per_layer].chunks_exact(per_layer) {
            let mut at = 0;
            let mut next = |n: usize| {
                at += n;
                &layer[at - n..at]
            };
            let (wq, wk, wv, wo) = (
                next(sizes[0]),
                next(sizes[1]),
                next(sizes[2]),
                next(sizes[3]),
            );
            let (wg, wu, wd) = (next(sizes[4]), next(sizes[5]), next(sizes[6]));
            let normed = &x[..m * h];
            agl_model::decode_rows_many(
                normed,
                &mut [(wq, &mut q, qd), (wk, &mut k, kvd), (wv, &mut v, kvd)],
                m,
                h,
            );
            agl_model::decode_rows(&x[..m * qd], wo, &mut y[..m * h], m, h, qd);
            agl_model::decode_rows_many(
                normed,
                &mut [(wg, &mut gate, inter), (wu, &mut up, inter)],
                m,
                h,
            );
            agl_model::decode_rows(&x[..m * inter], wd, &mut y[..m * h], m, h, inter);
        }
        let head = &weights[layers * per_layer..];
        agl_model::decode_rows(&x[..m * h], head, &mut y, m, vocab, h);
    };
    pass(); // warm-up
    (0..7)
        .map(|_| {
            let t = Instant::now();
            pass();
            (weights.len() * 4) as f64 / t.elapsed().as_secs_f64()
        })
        .fold(0.0, f64::max)
}

/// A sum in 16 lanes, each 64-byte line prefetched 4 KiB ahead.
fn prefetched_sum(chunk: &[f32]) -> f32 {
    let mut acc = [0f32; 16];
    for (i, x) in chunk.chunks_exact(16).enumerate() {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: prefetching is a hint; it never faults, even past the end.
        unsafe {
            use std::arch::x86_64::{_MM_HINT_T0, _mm_prefetch};
            _mm_prefetch::<_MM_HINT_T0>(chunk.as_ptr().wrapping_add(i * 16 + 1024) as *const i8);
        }
        for (a, v) in acc.iter_mut().zip(x) {
            *a += v;
        }
    }
    acc.iter().sum()
}

/// Best of three runs of `n` concurrent requests (the machine is shared),
/// `before` run before each.
fn best_of(engine: &EngineHandle, prompt: &[u32], n: usize, mut before: impl FnMut()) -> Rate {
    let runs: Vec<Rate> = (0..3)
        .map(|_| {
            before();
            run(engine, prompt, n)
        })
        .collect();
    let best = |f: fn(&Rate) -> f64| runs.iter().map(f).fold(0.0, f64::max);
    Rate {
        total: best(|r| r.total),
        decode: best(|r| r.decode),
    }
}

struct CpuRow {
    single: Rate,
    batch8: Rate,
    bytes: usize,
    /// Peak RSS after loading and the 8-request runs, in MB.
    rss: f64,
    /// With `bound`: each reader's best rate over runs of the buffer read
    /// as often as a run has decode steps, one before each batch-1 run.
    bound: Option<(f64, f64)>,
}

fn cpu_engine(dir: &Path, kind: Kind, prompt: &[u32], bound: bool) -> CpuRow {
    let model = Model::load(dir, kind, Device::Cpu).expect("load model");
    let bytes = weight_bytes(&model);
    let engine = spawn(model, 8);
    run(&engine, prompt, 1); // warm-up
    let batch8 = best_of(&engine, prompt, 8, || ());
    // Before the bound's buffers exist: the engine's own peak.
    let rss = peak_rss_mb();
    let reader = bound.then(|| Bound::new(bytes));
    let mut best = (0.0f64, 0.0f64);
    let single = best_of(&engine, prompt, 1, || {
        if let Some(reader) = &reader {
            let (torch, prefetched) = reader.run(NEW_TOKENS - 1);
            best = (best.0.max(torch), best.1.max(prefetched));
        }
    });
    CpuRow {
        single,
        batch8,
        bytes,
        rss,
        bound: reader.map(|_| best),
    }
}

fn verdict(ok: bool) -> &'static str {
    if ok { "met" } else { "NOT met" }
}

fn cpu_bench(dir: &Path) {
    let threads = tch::get_num_threads();
    let args = [NEW_TOKENS.to_string(), threads.to_string()];
    let hf = hf(dir, &args);
    let prompt = hf
        .as_ref()
        .map_or_else(synthetic_prompt, |h| ids(&h["prompt_ids"]));
    // f32 first, so the peak RSS is the f32 engine's alone.
    let f32_row = cpu_engine(dir, Kind::Float, &prompt, true);
    let rss = f32_row.rss;
    let (torch_read, prefetched_read) = f32_row.bound.unwrap_or((f64::NAN, f64::NAN));
    let bf16_row = cpu_engine(dir, Kind::BFloat16, &prompt, false);
    let bandwidth = torch_read.max(prefetched_read);
    let (matmul_1, matmul_8) = (matmul_bandwidth(1), matmul_bandwidth(8));
    println!(
        "SmolLM2-135M-Instruct, CPU, {threads} threads, {NEW_TOKENS} new tokens, greedy, prompt {} tokens; best of 3 runs",
        prompt.len()
    );
    println!(
        "streaming read of a {:.0} MB f32 buffer (the weights' size), {} passes a run as a run's decode steps, best of 3 runs, one before each f32 batch-1 run: libtorch sum {:.2} GB/s, prefetching read {:.2} GB/s; the bound takes {:.2}",
        f32_row.bytes as f64 / 1e6,
        NEW_TOKENS - 1,
        torch_read / 1e9,
        prefetched_read / 1e9,
        bandwidth / 1e9
    );
    println!(
        "the decode step's matmuls alone (every weight matrix once, as a step runs them), best of 7: 1 row {:.2} GB/s ({:.0}% of the bound), 8 rows {:.2} GB/s; the f32 batch-1 decode steps read {:.2} GB/s",
        matmul_1 / 1e9,
        100.0 * matmul_1 / bandwidth,
        matmul_8 / 1e9,
        f32_row.single.decode * f32_row.bytes as f64 / 1e9
    );
    println!(
        "{:<26} {:>11} {:>11} {:>11} {:>13} {:>9} {:>8}",
        "", "1 req tok/s", "decode only", "bound tok/s", "of the bound", "8 conc.", "8 / 1"
    );
    for (name, row) in [("agl engine f32", &f32_row), ("agl engine bf16", &bf16_row)] {
        let bound = bandwidth / row.bytes as f64;
        println!(
            "{name:<26} {:>11.1} {:>11.1} {bound:>11.1} {:>12.0}% {:>9.1} {:>7.2}x",
            row.single.total,
            row.single.decode,
            100.0 * row.single.decode / bound,
            row.batch8.total,
            row.batch8.total / row.single.total
        );
    }
    let hf_rss = hf.as_ref().map(|hf| {
        let f = |k: &str| hf[k].as_f64().unwrap_or(f64::NAN);
        println!(
            "{:<26} {:>11.1} {:>11} {:>11} {:>13} {:>9.1} {:>7.2}x",
            "transformers generate f32",
            f("single_tok_s"),
            "",
            "",
            "",
            f("batch8_tok_s"),
            f("batch8_tok_s") / f("single_tok_s")
        );
        println!(
            "ratio agl/transformers f32: 1 req {:.2}x, 8 conc. {:.2}x",
            f32_row.single.total / f("single_tok_s"),
            f32_row.batch8.total / f("batch8_tok_s")
        );
        f("peak_rss_mb")
    });
    let f32_share = f32_row.single.decode * f32_row.bytes as f64 / bandwidth;
    let batching = f32_row.batch8.total / f32_row.single.total;
    println!(
        "limits: f32 batch-1 decode >= 80% of the bound: {} ({:.0}%); batch 8 >= 3x batch 1: {} ({batching:.2}x)",
        verdict(f32_share >= 0.8),
        100.0 * f32_share,
        verdict(batching >= 3.0),
    );
    match hf_rss {
        Some(hf_rss) => println!(
            "peak RSS, f32: agl {rss:.0} MB, transformers {hf_rss:.0} MB: no more than transformers' {}",
            verdict(rss <= hf_rss)
        ),
        None => println!("peak RSS, f32: agl {rss:.0} MB"),
    }
}

fn cuda_bench(dir: &Path, random: bool) {
    const CONC: [usize; 3] = [1, 8, 32];
    let config_dir = tempfile_dir();
    let folder = if random {
        std::fs::write(config_dir.join("config.json"), smollm2_config().to_string()).unwrap();
        config_dir.as_path()
    } else {
        dir
    };
    let what = if random { "random init" } else { "weights" };
    println!(
        "SmolLM2-135M-Instruct shape ({what}), CUDA, {NEW_TOKENS} new tokens, greedy; tok/s at 1/8/32 concurrent requests"
    );
    println!(
        "{:<30} {:>10} {:>10} {:>10} {:>14}",
        "", "1 req", "8 conc.", "32 conc.", "GPU MB"
    );
    for (name, kind) in [("f32", Kind::Float), ("bf16", Kind::BFloat16)] {
        let model = if random {
            let config = ModelConfig::from_json(smollm2_config()).unwrap();
            Model::new(config, kind, Device::Cuda(0)).unwrap()
        } else {
            Model::load(dir, kind, Device::Cuda(0)).expect("load model")
        };
        let prompt = synthetic_prompt();
        let engine = spawn(model, 32);
        run(&engine, &prompt, 2); // warm-up
        let tok_s: Vec<f64> = CONC
            .iter()
            .map(|&n| run(&engine, &prompt, n).total)
            .collect();
        let used = gpu_used_mb();
        drop(engine);
        println!(
            "{:<30} {:>10.1} {:>10.1} {:>10.1} {:>14.0}",
            format!("agl engine {name}"),
            tok_s[0],
            tok_s[1],
            tok_s[2],
            used
        );
        let prompt_arg = prompt
            .iter()
            .map(u32::to_string)
            .collect::<Vec<_>>()
            .join(",");
        let args = [
            NEW_TOKENS.to_string(),
            "1".into(),
            "--device=cuda".into(),
            format!("--dtype={name}"),
            "--batches=1,8,32".into(),
            format!("--prompt={prompt_arg}"),
        ];
        if let Some(h) = hf(folder, &args) {
            let f = |k: &str| h["tok_s"][k].as_f64().unwrap_or(f64::NAN);
            println!(
                "{:<30} {:>10.1} {:>10.1} {:>10.1} {:>14.0}",
                format!("transformers generate {name}"),
                f("1"),
                f("8"),
                f("32"),
                h["peak_gpu_mb"].as_f64().unwrap_or(f64::NAN)
            );
        }
    }
    println!(
        "GPU MB: agl = nvidia-smi memory.used after the runs (whole GPU); transformers = torch.cuda.max_memory_allocated"
    );
}

/// A fresh folder for the random model's config.json (transformers reads it).
fn tempfile_dir() -> PathBuf {
    let dir = std::env::temp_dir().join(format!("agl-engine-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn main() {
    let dir = model_dir();
    let random =
        std::env::var_os("AGL_RANDOM_MODEL").is_some() || !dir.join("config.json").exists();
    match std::env::var("AGL_DEVICE").as_deref() {
        Ok("cuda") => {
            assert!(
                tch::Cuda::is_available(),
                "AGL_DEVICE=cuda but no CUDA device"
            );
            cuda_bench(&dir, random);
        }
        _ if random => {
            // The CPU comparison needs the real model and its tokenizer.
            println!(
                "no model folder at {} (or AGL_RANDOM_MODEL set): random model, no transformers comparison",
                dir.display()
            );
            cpu_random();
        }
        _ => cpu_bench(&dir),
    }
}

/// f32 on CPU without the real model (e.g. a GPU machine forced to CPU).
fn cpu_random() {
    let config = ModelConfig::from_json(smollm2_config()).unwrap();
    let engine = spawn(Model::new(config, Kind::Float, Device::Cpu).unwrap(), 8);
    let prompt = synthetic_prompt();
    run(&engine, &prompt, 1);
    println!(
        "agl engine f32 CPU random init: 1 req {:.1} tok/s, 8 conc. {:.1} tok/s",
        run(&engine, &prompt, 1).total,
        run(&engine, &prompt, 8).total
    );
}
