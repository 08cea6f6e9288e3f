//! One assembly of agl's parts from the configuration. Every entry point
//! (`agl run`, `agl serve`, `agl train`, `agl plugin test`, `agl engine
//! serve`) builds its store, gateway, plugins and engine server here, so a
//! part is wired in one place and each entry point gets the same part
//! (ARCHITECTURE.md, Assembly).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Context;

use agl_conversation::Renderer;
use agl_engine::EngineConfig;
use agl_gateway::{Gateway, MetricsSource, SharedPluginAdmin};
use agl_inference::InferenceServer;
use agl_store::Store;
use agl_tokenizer::Tokenizer;
use agl_wire::api::Render;

use crate::config::Config;
use crate::plugins::Plugins;
use crate::viewer::Viewer;
use agl_rl::TrainerSpec;
use agl_rl::ranks::DataParallel;

/// The store file at `db`, as `[store]` says (durability, retry budget).
pub fn store(config: &Config, db: &Path) -> anyhow::Result<Store> {
    Store::open_config(db, &config.store)
        .with_context(|| format!("opening the store {}", db.display()))
}

/// The policy folder, `model.path`.
pub fn model_dir(config: &Config) -> anyhow::Result<PathBuf> {
    config
        .model
        .path
        .clone()
        .context("model.path (a Hugging Face model folder) is required")
}

/// The policy's tokenizer: `model.tokenizer`, else `model.path`'s
/// `tokenizer.json`; none when there is neither.
pub fn tokenizer(config: &Config) -> anyhow::Result<Option<Arc<Tokenizer>>> {
    let path = match (&config.model.tokenizer, &config.model.path) {
        (Some(path), _) => path.clone(),
        (None, Some(dir)) => dir.join("tokenizer.json"),
        (None, None) => return Ok(None),
    };
    if !path.exists() {
        return Ok(None);
    }
    Ok(Some(Arc::new(Tokenizer::from_file(&path)?)))
}

/// The gateway's own policy: `model.path`'s chat template and tokenizer,
/// with `[engine]`'s `tool_parser` / `reasoning` over what the template
/// implies. What engines registered with `render = "gateway"` and no
/// `policy` of their own render with. None without `model.path`; an error
/// when `[engine] render = "gateway"` and the folder cannot render.
pub fn own_policy(config: &Config) -> anyhow::Result<Option<Renderer>> {
    let Some(dir) = &config.model.path else {
        return Ok(None);
    };
    match configured_renderer(dir, &config.engine) {
        Ok(r) => Ok(Some(r)),
        Err(e) if config.engine.render() == Render::Gateway => Err(e.context(format!(
            "engine.render = \"gateway\" needs a policy to render with: {}",
            dir.display()
        ))),
        Err(e) => {
            tracing::info!(dir = %dir.display(), error = %e, "no policy to render with");
            Ok(None)
        }
    }
}

/// The policy's template and tokenizer for gateway-rendered chat calls.
pub fn renderer(model_dir: &Path) -> anyhow::Result<Renderer> {
    Ok(Renderer::from_folder(model_dir)?)
}

/// [`renderer`] with `[engine]`'s `tool_parser` / `reasoning` applied over
/// what the template implies.
pub fn configured_renderer(
    model_dir: &Path,
    cfg: &crate::config::PolicyEngineConfig,
) -> anyhow::Result<Renderer> {
    let renderer = renderer(model_dir)?;
    let mut family = renderer.family();
    family.tools = cfg.tool_parser.unwrap_or(family.tools);
    family.reasoning = cfg.reasoning.unwrap_or(family.reasoning);
    Ok(renderer.with_family(family))
}

/// The adapter (and optional reward) plugin, loaded as the config says,
/// decoding with `tokenizer`; posted swaps are written under `uploads`.
pub async fn plugins(
    config: &Config,
    adapter: &Path,
    reward: Option<&Path>,
    tokenizer: Option<Arc<Tokenizer>>,
    uploads: PathBuf,
) -> anyhow::Result<Plugins> {
    Plugins::load(config, adapter, reward, tokenizer, uploads).await
}

/// One plugin of world `want` (`agl plugin test`), loaded as the config
/// says, decoding with `tokenizer`.
pub async fn plugin(
    config: &Config,
    path: &Path,
    want: agl_plugin_host::World,
    tokenizer: Option<Arc<Tokenizer>>,
) -> anyhow::Result<agl_plugin_host::Plugin> {
    crate::plugins::load_plugin(config, path, want, tokenizer).await
}

/// What the gateway serves besides the store and the proxy.
#[derive(Default)]
pub struct GatewayParts {
    /// Overrides `gateway.listen`.
    pub listen: Option<String>,
    /// The run folder whose `metrics.jsonl` the viewer reads.
    pub run_dir: PathBuf,
    /// The samples the viewer shows (the run's plugins, decoding with the
    /// policy's tokenizer).
    pub viewer: Option<Viewer>,
    /// Serves `/v1/plugins` (the hosting run's plugins).
    pub plugin_admin: Option<SharedPluginAdmin>,
    /// More `/metrics` (the trainer's gauges).
    pub metrics: Option<Arc<dyn MetricsSource>>,
}

/// A gateway bound to its listener.
pub struct BoundGateway {
    pub gateway: Gateway,
    pub listener: tokio::net::TcpListener,
    /// `http://ADDR` of the listener.
    pub base: String,
    pub admin_key: Option<String>,
}

/// The gateway over `store`: listening (port 0 = a free one, which proxy
/// URLs then name), rendering with the config's own policy, the viewer,
/// plugin hand-off and extra metrics as `parts` give them.
pub async fn gateway(
    config: &Config,
    store: Store,
    parts: GatewayParts,
) -> anyhow::Result<BoundGateway> {
    let mut gw = config.gateway.clone().with_env();
    if let Some(listen) = parts.listen {
        gw.listen = listen;
    }
    let listener = tokio::net::TcpListener::bind(&gw.listen)
        .await
        .with_context(|| format!("cannot listen on {}", gw.listen))?;
    gw.listen = listener.local_addr()?.to_string();
    let base = format!("http://{}", gw.listen);
    let admin_key = gw.admin_key.clone();
    let mut gateway =
        Gateway::new(store, gw).with_metrics_file(parts.run_dir.join("metrics.jsonl"));
    if let Some(renderer) = own_policy(config)? {
        gateway = gateway.with_policy(renderer);
    }
    if let Some(viewer) = parts.viewer {
        gateway = gateway.with_sample_viewer(Arc::new(viewer));
    }
    if let Some(admin) = parts.plugin_admin {
        gateway = gateway.with_plugin_admin(admin);
    }
    if let Some(metrics) = parts.metrics {
        gateway = gateway.with_metrics_source(metrics);
    }
    Ok(BoundGateway {
        gateway,
        listener,
        base,
        admin_key,
    })
}

/// The sample viewer of `plugins.adapter` (and `plugins.reward`), when
/// set, for a gateway that does not host a run (`agl serve`).
pub async fn standalone_viewer(config: &Config, run_dir: &Path) -> anyhow::Result<Option<Viewer>> {
    let Some(adapter) = &config.plugins.adapter else {
        return Ok(None);
    };
    let tokenizer = tokenizer(config)?;
    let loaded = plugins(
        config,
        adapter,
        config.plugins.reward.as_deref(),
        tokenizer.clone(),
        run_dir.join("plugins"),
    )
    .await
    .context("loading the viewer's plugins")?;
    Ok(Some(Viewer {
        plugins: Arc::new(loaded),
        tokenizer,
    }))
}

/// agl's own engine on the model folder `dir`, served as `name` (what `agl
/// run` embeds and `agl engine serve` serves over HTTP), loaded off the
/// async workers.
pub async fn engine_server(
    dir: &Path,
    name: &str,
    kind: tch::Kind,
    config: EngineConfig,
) -> anyhow::Result<InferenceServer> {
    let (dir, name) = (dir.to_path_buf(), name.to_owned());
    tokio::task::spawn_blocking(move || InferenceServer::load(&dir, &name, kind, config))
        .await
        .context("loading the engine")?
}

/// The trainer as `[train]` and `[model]` say: f32 on the GPU when there is
/// one, LoRA as configured. `training`: the KL reference and the
/// data-parallel ranks too; without, it only holds weights (`agl eval`
/// loads checkpoints into it for the engine).
pub fn trainer_spec(config: &Config, model_dir: &Path, training: bool) -> TrainerSpec {
    let train = &config.train;
    TrainerSpec {
        model_dir: model_dir.to_path_buf(),
        kind: tch::Kind::Float,
        device: tch::Device::cuda_if_available(),
        adamw: train.adamw(),
        schedule: train.schedule(config.run.steps),
        lora: train.lora.clone(),
        reference: training && train.kl_coef != 0.0,
        data_parallel: training.then(|| DataParallel {
            world_size: train.world_size,
            zero1: train.zero1,
            port: train.dist_port,
            timeout: std::time::Duration::from_secs(train.dist_timeout_secs),
            // `agl trainer-rank` (`main.rs`).
            rank_args: &["trainer-rank"],
        }),
        release_freed_memory: train.release_freed_memory,
    }
}
