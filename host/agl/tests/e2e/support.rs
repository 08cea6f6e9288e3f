//! Shared set-up for the end-to-end tests: the real `agl` binary, the
//! repo's venv, and a tiny random policy.

pub use crate::process::{pid_alive, python, repo_root, wait_until};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

pub const AGL: &str = env!("CARGO_BIN_EXE_agl");
pub const ADMIN: &str = "admin-key";

/// The port from the "listening" log line (which may carry ANSI colours).
pub fn port_from(line: &str) -> Option<u16> {
    let rest = &line[line.find("http://127.0.0.1:")? + "http://127.0.0.1:".len()..];
    let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
    digits.parse().ok()
}

/// A running `agl serve`; killed (SIGKILL) when dropped.
pub struct Served {
    pub child: Child,
    pub base: String,
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts `agl serve --db DB` on a free port with admin key [`ADMIN`] and
/// waits until it listens.
pub fn spawn_serve(db: &Path) -> Served {
    spawn_serve_with(db, None)
}

/// [`spawn_serve`] with `--config CONFIG`.
pub fn spawn_serve_with(db: &Path, config: Option<&Path>) -> Served {
    let mut cmd = Command::new(AGL);
    cmd.args(["serve", "--listen", "127.0.0.1:0", "--db"])
        .arg(db);
    if let Some(config) = config {
        cmd.arg("--config").arg(config);
    }
    let (child, port) = spawn_listening(cmd.env("AGL_ADMIN_KEY", ADMIN));
    Served {
        child,
        base: format!("http://127.0.0.1:{port}"),
    }
}

/// Spawns `cmd` (an `agl` server) and waits for the port its "listening"
/// log line names; its stderr is drained after that.
pub fn spawn_listening(cmd: &mut Command) -> (Child, u16) {
    let mut child = cmd
        .env_remove("AGL_CONFIG")
        .env_remove("AGL_LOG")
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn agl");
    let stderr = child.stderr.take().expect("stderr");
    let mut lines = BufReader::new(stderr).lines();
    let port = loop {
        let line = lines
            .next()
            .expect("agl exited before listening")
            .expect("read stderr");
        if let Some(p) = port_from(&line) {
            break p;
        }
    };
    // Keep draining stderr so the server never blocks on a full pipe.
    std::thread::spawn(move || for _ in lines {});
    (child, port)
}

/// A 2-layer llama with random weights over the test engine's byte ids
/// (vocab 1280), saved as a Hugging Face folder: the policy `agl run`
/// trains in tests. `max_positions` must cover the harness's prompts.
pub fn tiny_model(dir: &Path, max_positions: usize) {
    let config = agl_model::ModelConfig::from_json(serde_json::json!({
        "model_type": "llama", "vocab_size": 1280, "hidden_size": 32,
        "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
        "max_position_embeddings": max_positions, "tie_word_embeddings": true,
    }))
    .unwrap();
    tch::manual_seed(7);
    agl_model::Model::new(config, tch::Kind::Float, tch::Device::Cpu)
        .unwrap()
        .save(dir)
        .unwrap();
}

/// Runs a Python harness that prints one JSON document, off the async
/// workers; its output (and stderr) in the panic when it fails.
pub async fn python_json(mut cmd: Command) -> serde_json::Value {
    tokio::task::spawn_blocking(move || {
        let out = cmd.output().expect("run python");
        let stdout = String::from_utf8_lossy(&out.stdout).to_string();
        assert!(
            out.status.success(),
            "harness failed: {stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_str(stdout.trim()).expect("harness JSON")
    })
    .await
    .unwrap()
}

/// The repository root.
pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// A built plugin, `build/plugins/NAME.wasm`.
pub fn built_plugin(name: &str) -> String {
    let path = repo().join("build/plugins").join(format!("{name}.wasm"));
    assert!(
        path.exists(),
        "{} missing: run plugins/build.sh",
        path.display()
    );
    path.display().to_string()
}

/// The shipped fixtures, `examples/fixtures`.
pub fn fixtures() -> PathBuf {
    repo().join("examples/fixtures")
}
