//! `agl plugin test | inspect | new | build`: the plugin author's offline
//! tools, and `reload` for a running `agl run`.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Context;
use clap::Subcommand;

use agl::assembly;
use agl::config::Config;
use agl::plugins::plugin_host;
use agl::scaffold::python::Kind;
use agl_plugin_host::World;
use agl_tokenizer::Tokenizer;
use agl_wire::api::{LoadedPlugin, PluginRole};
use agl_wire::rollout::{BreakKind, Rollout};

use super::render::{self, Style};

#[derive(Subcommand)]
pub enum PluginCommand {
    /// Run a sample-adapter and/or a reward plugin over recorded rollouts.
    Test {
        /// The sample-adapter plugin (.wasm).
        #[arg(long, required_unless_present = "reward")]
        plugin: Option<PathBuf>,
        /// A reward plugin (.wasm).
        #[arg(long)]
        reward: Option<PathBuf>,
        /// Rollout JSONL (format: plugins/README.md).
        #[arg(long)]
        rollouts: PathBuf,
        /// tokenizer.json to decode tokens with (default: model.tokenizer from the config).
        #[arg(long)]
        tokenizer: Option<PathBuf>,
        /// One JSON object per sample on stdout instead of the readable view.
        #[arg(long)]
        json: bool,
        /// Show whole prompts instead of their last characters.
        #[arg(long)]
        full: bool,
    },
    /// Show a plugin's world, description, imports and exports.
    Inspect {
        path: PathBuf,
        #[arg(long)]
        json: bool,
    },
    /// Swap the adapter and/or reward of a running `agl run`, through its
    /// gateway (admin key required when auth is on). The next rollouts the
    /// run collects use the new plugin; if it fails to load or validate,
    /// the old one keeps serving and this command fails with the reason.
    Reload {
        /// The gateway of the run, e.g. http://127.0.0.1:8400.
        #[arg(long, env = "AGL_GATEWAY")]
        gateway: String,
        #[arg(long, env = "AGL_ADMIN_KEY", hide_env_values = true)]
        admin_key: Option<String>,
        /// A new sample-adapter plugin (.wasm).
        #[arg(long)]
        adapter: Option<PathBuf>,
        /// A new reward plugin (.wasm).
        #[arg(long)]
        reward: Option<PathBuf>,
        /// Config table name (`[plugin.NAME]`); default: the file stem.
        #[arg(long)]
        name: Option<String>,
    },
    /// Scaffold a new plugin that builds and passes its test: a Rust
    /// sample-adapter crate, or with `--lang python` a Python reward or
    /// adapter folder.
    New {
        /// Plugin name: lowercase letters, digits and '-'.
        name: String,
        /// Folder to create the plugin in.
        #[arg(long, default_value = ".")]
        dir: PathBuf,
        #[arg(long, value_enum, default_value_t = Lang::Rust)]
        lang: Lang,
        /// What the plugin does (Rust scaffolds are adapters).
        #[arg(long, value_enum, default_value_t = Kind::Adapter)]
        kind: Kind,
        /// Path to an agl-plugin SDK crate (Rust; default: the SDK inside
        /// this agl, written out under ~/.cache/agl/sdk).
        #[arg(long)]
        sdk: Option<PathBuf>,
    },
    /// Build a plugin folder into DIR/NAME.wasm: a Python plugin
    /// (plugin.toml + app.py; its test_*.py run first) with componentize-py,
    /// a Rust crate with cargo for wasm32-wasip2.
    Build {
        dir: PathBuf,
        /// Where to write the component (default DIR/NAME.wasm).
        #[arg(long)]
        out: Option<PathBuf>,
        /// The Python with componentize-py (default $AGL_VENV/bin/python, else python3).
        #[arg(long)]
        python: Option<PathBuf>,
        /// Skip a Python plugin's tests.
        #[arg(long)]
        no_test: bool,
    },
    /// The host's sample rules over a rollout on stdin (JSON): the Python
    /// SDK's native stand-in of `agl:adapter/samples`.
    #[command(hide = true)]
    Rules,
}

#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Lang {
    Rust,
    Python,
}

pub fn run(cmd: PluginCommand, config: Config) -> anyhow::Result<ExitCode> {
    match cmd {
        PluginCommand::Test {
            plugin,
            reward,
            rollouts,
            tokenizer,
            json,
            full,
        } => {
            let tokenizer_path = tokenizer.or_else(|| config.model.tokenizer.clone());
            let opts = TestOptions {
                adapter: plugin,
                reward,
                rollouts,
                tokenizer: tokenizer_path,
                json,
                full,
            };
            super::runtime()?.block_on(test(opts, &config))
        }
        PluginCommand::Reload {
            gateway,
            admin_key,
            adapter,
            reward,
            name,
        } => {
            let swaps: Vec<(PluginRole, PathBuf)> = [
                adapter.map(|p| (PluginRole::Adapter, p)),
                reward.map(|p| (PluginRole::Reward, p)),
            ]
            .into_iter()
            .flatten()
            .collect();
            anyhow::ensure!(
                !swaps.is_empty(),
                "nothing to reload: pass --adapter and/or --reward"
            );
            super::runtime()?.block_on(reload(&gateway, admin_key, swaps, name))
        }
        PluginCommand::Inspect { path, json } => {
            super::runtime()?.block_on(inspect(&path, json, &config))
        }
        PluginCommand::New {
            name,
            dir,
            lang: Lang::Python,
            kind,
            sdk: _,
        } => {
            let created = agl::scaffold::python::scaffold(&name, kind, &dir)?;
            println!("created {}", created.display());
            println!(
                "  agl plugin build {} && agl plugin test --rollouts ROLLOUTS.jsonl {} {}",
                created.display(),
                if kind == Kind::Reward {
                    "--reward"
                } else {
                    "--plugin"
                },
                created.join(format!("{name}.wasm")).display()
            );
            Ok(ExitCode::SUCCESS)
        }
        PluginCommand::New {
            kind: Kind::Reward, ..
        } => anyhow::bail!(
            "a Rust scaffold is a sample adapter; for a reward use --lang python, or \
             implement agl_plugin::Reward in the scaffolded crate (plugins/README.md)"
        ),
        PluginCommand::Rules => super::rules::run(),
        PluginCommand::Build {
            dir,
            out,
            python,
            no_test,
        } => {
            let built = agl::plugin_build::build(&agl::plugin_build::BuildOptions {
                dir,
                out,
                python,
                test: !no_test,
            })?;
            println!("{}", built.display());
            Ok(ExitCode::SUCCESS)
        }
        PluginCommand::New { name, dir, sdk, .. } => {
            let sdk = match sdk {
                Some(p) => p,
                None => agl::scaffold::installed_sdk(None)?,
            };
            let sdk = sdk.canonicalize().with_context(|| {
                format!("agl-plugin SDK not found at {} (pass --sdk)", sdk.display())
            })?;
            let created = agl::scaffold::scaffold(&name, &dir, &sdk)?;
            println!("created {}", created.display());
            println!(
                "  cd {} && cargo test && cargo build --release --target wasm32-wasip2",
                created.display()
            );
            Ok(ExitCode::SUCCESS)
        }
    }
}

struct TestOptions {
    adapter: Option<PathBuf>,
    reward: Option<PathBuf>,
    rollouts: PathBuf,
    tokenizer: Option<PathBuf>,
    json: bool,
    full: bool,
}

async fn test(opts: TestOptions, config: &Config) -> anyhow::Result<ExitCode> {
    let tokenizer = match &opts.tokenizer {
        Some(p) => Some(Arc::new(Tokenizer::from_file(p)?)),
        None => None,
    };
    let rollouts: Vec<Arc<Rollout>> = agl_wire::rollout::read_jsonl(&opts.rollouts)?
        .into_iter()
        .map(Arc::new)
        .collect();
    let mut adapter = None;
    if let Some(path) = &opts.adapter {
        adapter =
            Some(assembly::plugin(config, path, World::SampleAdapter, tokenizer.clone()).await?);
    }
    let mut reward = None;
    if let Some(path) = &opts.reward {
        reward = Some(assembly::plugin(config, path, World::Reward, tokenizer.clone()).await?);
    }
    let style = Style::for_stdout(opts.full);
    let mut out = std::io::stdout().lock();
    let mut totals = Totals::default();
    for rollout in &rollouts {
        let score = match &reward {
            Some(r) => Some(r.reward(rollout).await),
            None => None,
        };
        totals.rollouts += 1;
        let reward_value = match &score {
            Some(Ok(v)) => *v,
            _ => None,
        };
        if let Some(Err(e)) = &score {
            totals.failures += 1;
            eprintln!("rollout {}: reward failed: {e}", rollout.id);
        }
        match reward_value {
            Some(v) => totals.rewards.push(v),
            None => totals.unscored += 1,
        }
        let Some(adapter) = &adapter else {
            // A reward alone: one line per rollout.
            if opts.json {
                let line = serde_json::json!({
                    "rollout_id": rollout.id, "group_id": rollout.group_id,
                    "reward": reward_value,
                });
                writeln!(out, "{line}")?;
            } else {
                render::rollout_header(&mut out, rollout, reward_value)?;
            }
            continue;
        };
        let samples = match adapter.build_samples(rollout).await {
            Ok(s) => s,
            Err(e) => {
                totals.failures += 1;
                if !opts.json {
                    render::rollout_header(&mut out, rollout, reward_value)?;
                }
                eprintln!("rollout {}: sample build failed: {e}", rollout.id);
                continue;
            }
        };
        for s in &samples {
            totals.samples += 1;
            totals.trained_tokens += s.trainable_tokens();
            if let Some(b) = &s.break_before {
                *totals.breaks.entry(b.kind).or_default() += 1;
            }
        }
        if opts.json {
            for (i, s) in samples.iter().enumerate() {
                let line = serde_json::json!({
                    "rollout_id": rollout.id, "group_id": rollout.group_id,
                    "sample_index": i, "reward": reward_value, "sample": s,
                });
                writeln!(out, "{line}")?;
            }
        } else {
            render::rollout_header(&mut out, rollout, reward_value)?;
            for (i, s) in samples.iter().enumerate() {
                render::sample(&mut out, i, s, tokenizer.as_deref(), &style)?;
            }
        }
    }
    let summary = totals.summary(adapter.is_some());
    if opts.json {
        eprintln!("{summary}");
    } else {
        writeln!(out, "{summary}")?;
    }
    Ok(if totals.failures == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

#[derive(Default)]
struct Totals {
    rollouts: usize,
    samples: usize,
    trained_tokens: usize,
    breaks: BTreeMap<BreakKind, usize>,
    rewards: Vec<f64>,
    unscored: usize,
    failures: usize,
}

impl Totals {
    /// The closing line; without an adapter only the rewards count.
    fn summary(&self, with_samples: bool) -> String {
        let breaks: Vec<String> = BreakKind::ALL
            .iter()
            .map(|k| {
                format!(
                    "{} {}",
                    k.as_str(),
                    self.breaks.get(k).copied().unwrap_or(0)
                )
            })
            .collect();
        let mean = if self.rewards.is_empty() {
            "-".to_string()
        } else {
            format!(
                "{:.3}",
                self.rewards.iter().sum::<f64>() / self.rewards.len() as f64
            )
        };
        if !with_samples {
            return format!(
                "summary: {} rollouts; reward mean {} ({} scored, {} without); {} failed",
                self.rollouts,
                mean,
                self.rewards.len(),
                self.unscored,
                self.failures
            );
        }
        format!(
            "summary: {} rollouts, {} samples ({} per rollout), {} trained tokens; breaks: {}; reward mean {} ({} scored, {} without); {} failed",
            self.rollouts,
            self.samples,
            agl::run::report::per_rollout(self.samples, self.rollouts),
            self.trained_tokens,
            breaks.join(", "),
            mean,
            self.rewards.len(),
            self.unscored,
            self.failures
        )
    }
}

/// Posts each plugin's bytes to the run's gateway (so the run may be on
/// another machine) and prints what now serves.
async fn reload(
    gateway: &str,
    admin_key: Option<String>,
    swaps: Vec<(PluginRole, PathBuf)>,
    name: Option<String>,
) -> anyhow::Result<ExitCode> {
    let http = reqwest::Client::new();
    for (role, path) in swaps {
        let wasm = std::fs::read(&path).with_context(|| format!("reading {}", path.display()))?;
        let name = name
            .clone()
            .unwrap_or_else(|| agl::config::plugin_name(&path));
        let url = format!(
            "{}/v1/plugins/{}?name={}",
            gateway.trim_end_matches('/'),
            role.as_str(),
            agl_wire::urls::encode_segment(&name)
        );
        let mut req = http
            .post(&url)
            .header("content-type", "application/wasm")
            .body(wasm);
        if let Some(key) = &admin_key {
            req = req.bearer_auth(key);
        }
        let resp = req
            .send()
            .await
            .with_context(|| format!("reaching {gateway}"))?;
        let status = resp.status();
        let text = resp.text().await.unwrap_or_default();
        if !status.is_success() {
            let message = serde_json::from_str::<agl_wire::ErrorBody>(&text)
                .map(|b| b.error.message)
                .unwrap_or(text);
            anyhow::bail!("{} {}: {status}: {message}", role.as_str(), path.display());
        }
        let loaded: LoadedPlugin = serde_json::from_str(&text)
            .with_context(|| format!("unexpected answer from {url}: {text}"))?;
        println!(
            "{}: {} {} ({})",
            loaded.role.as_str(),
            loaded.name,
            loaded.version,
            &loaded.wasm_hash[..loaded.wasm_hash.len().min(12)]
        );
    }
    Ok(ExitCode::SUCCESS)
}

async fn inspect(path: &Path, json: bool, config: &Config) -> anyhow::Result<ExitCode> {
    let host = plugin_host(config)?;
    let info = host.inspect(path).await?;
    let mut out = std::io::stdout().lock();
    if json {
        writeln!(out, "{}", serde_json::to_string_pretty(&info)?)?;
    } else {
        render::inspection(&mut out, &info)?;
    }
    Ok(ExitCode::SUCCESS)
}
