//! `agl.toml`: one file configures every part; `-o key=value` overrides any
//! key by its dotted path. Relative paths resolve against the file's folder.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;

mod report;
mod train;
pub use report::{ReportConfig, WandbConfig, WandbMode};
pub use train::{
    EngineKind, InFlightMode, LoopMode, PauseMode, PolicyEngineConfig, RunConfig, TrainConfig,
};

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("config {path}: {message}")]
    Parse { path: String, message: String },
    #[error("override `{0}`: expected key=value, e.g. -o plugins.limits.deadline_ms=500")]
    OverrideSyntax(String),
    #[error("override `{key}`: `{segment}` is not a table")]
    OverrideTarget { key: String, segment: String },
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    #[serde(default)]
    pub model: PolicyConfig,
    #[serde(default)]
    pub plugins: agl_plugin_host::PluginsConfig,
    #[serde(default)]
    pub gateway: agl_gateway::GatewayConfig,
    #[serde(default)]
    pub store: agl_store::StoreConfig,
    #[serde(default)]
    pub controller: agl_controller::ControllerConfig,
    /// `agl run`: data, loop shape, validation, checkpoints.
    #[serde(default)]
    pub run: RunConfig,
    /// `agl run`: the update (estimator, optimizer, loss).
    #[serde(default)]
    pub train: TrainConfig,
    /// `agl run`: the engine serving the policy.
    #[serde(default)]
    pub engine: PolicyEngineConfig,
    /// `agl run` / `agl train`: TensorBoard and W&B exports of the steps.
    #[serde(default)]
    pub report: ReportConfig,
    /// Each plugin's own table, keyed by the plugin file's stem
    /// (`[plugin.exact-match]` configures `exact-match.wasm`).
    #[serde(default)]
    pub plugin: BTreeMap<String, toml::Table>,
    /// The tables as loaded (the file, then the overrides), paths
    /// resolved: what [`Config::export_json`] starts from.
    #[serde(skip)]
    given: toml::Table,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PolicyConfig {
    /// The policy: a Hugging Face folder (config.json, safetensors,
    /// tokenizer.json, tokenizer_config.json), e.g. what `agl model fetch
    /// smollm2` prints.
    pub path: Option<PathBuf>,
    /// The engine's dtype for the policy (`f32` | `bf16`); the trainer
    /// always keeps f32 master weights.
    #[serde(default)]
    pub dtype: Dtype,
    /// A Hugging Face `tokenizer.json`; its chat template is read from the
    /// `tokenizer_config.json` or `chat_template.jinja` beside it.
    pub tokenizer: Option<PathBuf>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Dtype {
    #[default]
    F32,
    Bf16,
}

impl PolicyConfig {
    pub fn kind(&self) -> tch::Kind {
        match self.dtype {
            Dtype::F32 => tch::Kind::Float,
            Dtype::Bf16 => tch::Kind::BFloat16,
        }
    }
}

impl Config {
    /// Loads `path` (if given) and applies `overrides` (`a.b.c=value`, the
    /// value parsed as TOML, or taken as a string when it does not parse).
    pub fn load(path: Option<&Path>, overrides: &[String]) -> Result<Self, ConfigError> {
        let (mut table, base, shown) = match path {
            Some(p) => {
                let text = std::fs::read_to_string(p).map_err(|source| ConfigError::Read {
                    path: p.to_path_buf(),
                    source,
                })?;
                let table: toml::Table =
                    text.parse()
                        .map_err(|e: toml::de::Error| ConfigError::Parse {
                            path: p.display().to_string(),
                            message: e.to_string(),
                        })?;
                let base = p.parent().map(Path::to_path_buf).unwrap_or_default();
                (table, base, p.display().to_string())
            }
            None => (toml::Table::new(), PathBuf::new(), "(defaults)".to_string()),
        };
        for o in overrides {
            apply_override(&mut table, o)?;
        }
        let mut config: Config =
            toml::Value::Table(table.clone())
                .try_into()
                .map_err(|e: toml::de::Error| ConfigError::Parse {
                    path: shown.clone(),
                    message: e.to_string(),
                })?;
        config
            .gateway
            .check()
            .and_then(|()| config.engine.check())
            .map_err(|message| ConfigError::Parse {
                path: shown,
                message,
            })?;
        config.given = table;
        config.resolve_paths(&base);
        Ok(config)
    }

    /// The path keys, by dotted name.
    fn path_fields(&mut self) -> [(&'static str, &mut Option<PathBuf>); 10] {
        [
            ("model.tokenizer", &mut self.model.tokenizer),
            ("model.path", &mut self.model.path),
            ("run.data", &mut self.run.data),
            ("run.out_dir", &mut self.run.out_dir),
            ("plugins.adapter", &mut self.plugins.adapter),
            ("plugins.reward", &mut self.plugins.reward),
            ("plugins.cache_dir", &mut self.plugins.cache_dir),
            ("controller.workdir", &mut self.controller.workdir),
            ("controller.logs_dir", &mut self.controller.logs_dir),
            (
                "controller.kube.job_template",
                &mut self.controller.kube.job_template,
            ),
        ]
    }

    /// Resolves the path keys against `base` (`~` against `$HOME`), in the
    /// config and in the tables it was loaded from.
    fn resolve_paths(&mut self, base: &Path) {
        let home = std::env::var_os("HOME").map(PathBuf::from);
        let fix = |p: &mut Option<PathBuf>| {
            let Some(path) = p else { return };
            if let (Ok(rest), Some(home)) = (path.strip_prefix("~"), &home) {
                *path = home.join(rest);
            } else if path.is_relative() {
                *path = base.join(&*path);
            }
        };
        let mut given = std::mem::take(&mut self.given);
        for (key, path) in self.path_fields() {
            fix(path);
            if let Some(path) = path {
                set_given(&mut given, key, path);
            }
        }
        // `python = "python3"` is a command on PATH; a path resolves.
        if let Some(python) = &mut self.report.python
            && python.components().count() > 1
        {
            let mut resolved = Some(std::mem::take(python));
            fix(&mut resolved);
            if let Some(path) = resolved {
                set_given(&mut given, "report.python", &path);
                *python = path;
            }
        }
        self.given = given;
    }

    /// The table for the plugin at `path`, keyed by its file stem.
    pub fn plugin_table(&self, path: &Path) -> toml::Table {
        self.plugin
            .get(&plugin_name(path))
            .cloned()
            .unwrap_or_default()
    }
}

/// A plugin's name: its file stem (`build/plugins/exact-match.wasm` -> `exact-match`).
pub fn plugin_name(path: &Path) -> String {
    path.file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| path.display().to_string())
}

/// Sets the string at dotted `key` in `table` to `path` where the tables
/// hold that key.
fn set_given(table: &mut toml::Table, key: &str, path: &Path) {
    let mut segments = key.split('.').peekable();
    let mut cursor = table;
    while let Some(seg) = segments.next() {
        if segments.peek().is_none() {
            if let Some(v) = cursor.get_mut(seg) {
                *v = toml::Value::String(path.display().to_string());
            }
            return;
        }
        match cursor.get_mut(seg).and_then(toml::Value::as_table_mut) {
            Some(next) => cursor = next,
            None => return,
        }
    }
}

fn apply_override(table: &mut toml::Table, spec: &str) -> Result<(), ConfigError> {
    let (key, raw) = spec
        .split_once('=')
        .ok_or_else(|| ConfigError::OverrideSyntax(spec.to_string()))?;
    let key = key.trim();
    if key.is_empty() || key.split('.').any(str::is_empty) {
        return Err(ConfigError::OverrideSyntax(spec.to_string()));
    }
    let value = format!("v = {raw}")
        .parse::<toml::Table>()
        .ok()
        .and_then(|mut t| t.remove("v"))
        .unwrap_or_else(|| toml::Value::String(raw.to_string()));
    let segments: Vec<&str> = key.split('.').collect();
    let (last, parents) = segments.split_last().expect("key is non-empty");
    let mut cursor = table;
    for seg in parents {
        let entry = cursor
            .entry(seg.to_string())
            .or_insert_with(|| toml::Value::Table(toml::Table::new()));
        cursor = entry
            .as_table_mut()
            .ok_or_else(|| ConfigError::OverrideTarget {
                key: key.to_string(),
                segment: seg.to_string(),
            })?;
    }
    cursor.insert(last.to_string(), value);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overrides_set_nested_keys_with_typed_values() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("agl.toml");
        std::fs::write(
            &path,
            "[model]\ntokenizer = \"tok/tokenizer.json\"\n[plugin.exact-match]\npattern = \"x\"\n",
        )
        .unwrap();
        let config = Config::load(
            Some(&path),
            &[
                "plugins.limits.deadline_ms=500".into(),
                "plugin.exact-match.pattern=ANSWER: (.*)".into(),
                "plugin.trajectory.chain_by_agent=false".into(),
            ],
        )
        .unwrap();
        assert_eq!(
            config.plugins.limits.deadline,
            std::time::Duration::from_millis(500)
        );
        assert_eq!(
            config.model.tokenizer.clone().unwrap(),
            dir.path().join("tok/tokenizer.json")
        );
        let em = config.plugin_table(Path::new("x/exact-match.wasm"));
        assert_eq!(em["pattern"].as_str(), Some("ANSWER: (.*)"));
        let tr = config.plugin_table(Path::new("trajectory.wasm"));
        assert_eq!(tr["chain_by_agent"].as_bool(), Some(false));
        assert!(config.plugin_table(Path::new("other.wasm")).is_empty());
    }

    #[test]
    fn engine_rendering_keys_parse_and_bad_values_are_refused() {
        let config = Config::load(None, &[]).unwrap();
        assert_eq!(config.engine.tool_parser, None, "read from the template");
        let config = Config::load(
            None,
            &[
                "engine.render=gateway".into(),
                "engine.api=sglang".into(),
                "engine.tool_parser=qwen3_coder".into(),
                "engine.reasoning=true".into(),
            ],
        )
        .unwrap();
        assert_eq!(config.engine.render(), agl_wire::api::Render::Gateway);
        assert_eq!(config.engine.api, agl_wire::api::EngineApi::Sglang);
        assert_eq!(
            config.engine.tool_parser,
            Some(agl_conversation::ToolFormat::Qwen3Coder)
        );
        assert_eq!(config.engine.reasoning, Some(true));
        for bad in ["engine.api=vllm", "engine.tool_parser=xml"] {
            let e = Config::load(None, &[bad.into()]).unwrap_err();
            assert!(format!("{e:#}").contains("unknown variant"), "{bad}: {e:#}");
        }
    }

    #[test]
    fn agl_engines_are_rendered_for_by_the_gateway_and_others_render_themselves() {
        use agl_wire::api::Render;
        let render = |o: &[&str]| {
            let o: Vec<String> = o.iter().map(|s| s.to_string()).collect();
            Config::load(None, &o).map(|c| c.engine.render())
        };
        assert_eq!(render(&[]).unwrap(), Render::Gateway, "embedded");
        assert_eq!(render(&["engine.kind=agl"]).unwrap(), Render::Gateway);
        assert_eq!(render(&["engine.kind=vllm"]).unwrap(), Render::Engine);
        let vllm = render(&["engine.kind=vllm", "engine.render=gateway"]);
        assert_eq!(vllm.unwrap(), Render::Gateway);
        for kind in ["embedded", "agl"] {
            let e = render(&[&format!("engine.kind={kind}"), "engine.render=engine"]).unwrap_err();
            assert!(
                format!("{e:#}").contains("renders no chat"),
                "{kind}: {e:#}"
            );
        }
    }

    #[test]
    fn gateway_section_has_defaults_and_takes_overrides() {
        let config = Config::load(None, &[]).unwrap();
        assert_eq!(config.gateway.listen, "127.0.0.1:8400");
        assert_eq!(config.gateway.body_limit_bytes, 32 * 1024 * 1024);
        // What the gateway takes, the embedded engine takes (it answered
        // 413 above 2 MB once).
        assert!(agl_inference::BODY_LIMIT_BYTES > config.gateway.body_limit_bytes);
        for bad in [
            "gateway.max_connections=0",
            "gateway.header_timeout_secs=-1",
            "gateway.body_timeout_secs=0",
            "gateway.stream_ping_secs=0",
        ] {
            let e = Config::load(None, &[bad.into()]).unwrap_err().to_string();
            let key = bad.split('=').next().unwrap();
            assert!(e.contains(key), "{bad}: {e}");
        }
        assert_eq!(config.gateway.admin_key, None);
        let config = Config::load(
            None,
            &[
                "gateway.admin_key=k".into(),
                "gateway.body_limit_bytes=1024".into(),
                "gateway.public_base_url=https://gw.example".into(),
            ],
        )
        .unwrap();
        assert_eq!(config.gateway.admin_key.as_deref(), Some("k"));
        assert_eq!(config.gateway.body_limit_bytes, 1024);
        assert_eq!(
            config.gateway.public_base_url.as_deref(),
            Some("https://gw.example")
        );
        assert!(Config::load(None, &["gateway.nope=1".into()]).is_err());
    }

    #[test]
    fn bad_input_is_a_clear_error() {
        let err = Config::load(None, &["novalue".into()]).unwrap_err();
        assert!(err.to_string().contains("expected key=value"), "{err}");
        let err = Config::load(None, &["plugins.limitz.x=1".into()]).unwrap_err();
        assert!(err.to_string().contains("limitz"), "{err}");
        let err = Config::load(None, &["model=1".into(), "model.tokenizer=x".into()]).unwrap_err();
        assert!(err.to_string().contains("not a table"), "{err}");
    }
}
