//! `[report]` in `agl.toml`: where a run's step records go besides
//! `metrics.jsonl` (TensorBoard event files, a Weights & Biases run), and
//! the config as those exports record it ([`Config::export_json`]).

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::Config;

/// `[report]`: exports of the step records, written by a Python sidecar
/// (`run/report/export.rs`). A sidecar that cannot start or dies is a
/// warning, never a failed run.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ReportConfig {
    /// TensorBoard event files under `<out_dir>/tensorboard/`.
    pub tensorboard: bool,
    /// A Weights & Biases run (`wandb = { project = "...", mode = "offline" }`).
    pub wandb: Option<WandbConfig>,
    /// The Python that runs the sidecar (with the `tensorboard` / `wandb`
    /// packages); default `$AGL_VENV/bin/python`, else `python3`.
    pub python: Option<PathBuf>,
}

impl ReportConfig {
    /// Whether anything is exported.
    pub fn any(&self) -> bool {
        self.tensorboard || self.wandb.is_some()
    }
}

/// `[report.wandb]`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WandbConfig {
    pub project: String,
    #[serde(default)]
    pub mode: WandbMode,
    /// The W&B team or user; default the API key's.
    #[serde(default)]
    pub entity: Option<String>,
    /// The run's display name; default the run folder's name.
    #[serde(default)]
    pub name: Option<String>,
}

/// Where the W&B run goes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WandbMode {
    /// `<out_dir>/wandb/offline-run-*`, uploaded later by `wandb sync`:
    /// needs no network and no API key.
    #[default]
    Offline,
    /// Streamed to the W&B server as the run goes (`WANDB_API_KEY`).
    Online,
}

/// Key words that mark a value as a secret (`gateway.admin_key`,
/// `gateway.token_secret`, a plugin's `api_key`): whole `_`/`-` separated
/// words of the key, so `tokenizer` or `max_tokens` are kept.
const SECRET_WORDS: [&str; 8] = [
    "key",
    "apikey",
    "secret",
    "token",
    "password",
    "passwd",
    "credential",
    "credentials",
];

impl Config {
    /// The config as the exports record it (W&B's run config, TensorBoard
    /// text): every table as loaded (the file and the `-o` overrides,
    /// paths resolved), with agl's own sections (`[run]`, `[train]`,
    /// `[engine]`, `[report]`) complete with their defaults, and string
    /// values under secret-looking keys replaced by `"<redacted>"`.
    pub fn export_json(&self) -> serde_json::Value {
        let mut root = match serde_json::to_value(&self.given) {
            Ok(serde_json::Value::Object(map)) => map,
            _ => serde_json::Map::new(),
        };
        let sections = [
            ("run", serde_json::to_value(&self.run)),
            ("train", serde_json::to_value(&self.train)),
            ("engine", serde_json::to_value(&self.engine)),
            ("report", serde_json::to_value(&self.report)),
        ];
        for (name, resolved) in sections {
            let Ok(serde_json::Value::Object(resolved)) = resolved else {
                continue;
            };
            let section = root
                .entry(name)
                .or_insert_with(|| serde_json::Value::Object(serde_json::Map::new()));
            if let serde_json::Value::Object(section) = section {
                // Keys only the file has (an older alias, a key serde
                // skips) stay; the resolved value wins.
                section.extend(resolved);
            }
        }
        let mut value = serde_json::Value::Object(root);
        redact(&mut value);
        value
    }
}

fn is_secret(key: &str) -> bool {
    key.to_ascii_lowercase()
        .split(['_', '-', '.'])
        .any(|word| SECRET_WORDS.contains(&word))
}

fn redact(value: &mut serde_json::Value) {
    match value {
        serde_json::Value::Object(map) => {
            for (key, v) in map.iter_mut() {
                if v.is_string() && is_secret(key) {
                    *v = serde_json::Value::String("<redacted>".into());
                } else {
                    redact(v);
                }
            }
        }
        serde_json::Value::Array(items) => items.iter_mut().for_each(redact),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    #[test]
    fn report_section_parses_and_bad_values_are_refused() {
        let config = Config::load(None, &[]).unwrap();
        assert!(!config.report.any(), "nothing is exported by default");
        let config = Config::load(
            None,
            &[
                "report.tensorboard=true".into(),
                "report.wandb={ project = \"p\", name = \"n\" }".into(),
            ],
        )
        .unwrap();
        assert!(config.report.tensorboard);
        let wandb = config.report.wandb.clone().unwrap();
        assert_eq!(
            (wandb.project.as_str(), wandb.mode, wandb.name.as_deref()),
            ("p", WandbMode::Offline, Some("n")),
            "offline unless asked"
        );
        let config = Config::load(
            None,
            &[
                "report.wandb.project=p".into(),
                "report.python=python3".into(),
            ],
        )
        .unwrap();
        assert_eq!(config.report.wandb.unwrap().mode, WandbMode::Offline);
        let python = config.report.python.unwrap();
        assert_eq!(python, Path::new("python3"), "a command on PATH stays one");
        for bad in [
            "report.wandb={ project = \"p\", mode = \"cloud\" }",
            "report.wandb={ mode = \"online\" }",
            "report.tensorbord=true",
        ] {
            let e = Config::load(None, &[bad.into()]).unwrap_err();
            assert!(
                format!("{e:#}").contains("unknown") || format!("{e:#}").contains("missing"),
                "{bad}: {e:#}"
            );
        }
    }

    #[test]
    fn export_json_has_the_given_tables_resolved_sections_and_no_secrets() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("agl.toml");
        std::fs::write(
            &path,
            "[model]\npath = \"model\"\n[gateway]\nadmin_key = \"hunter2\"\nmax_n = 4\n\
             [run]\ndata = \"d.jsonl\"\nsteps = 3\n[train]\ntis_threshold = 3.0\n\
             [plugin.judge]\napi_key = \"sk-1\"\nmodel = \"m\"\n\
             [report]\npython = \"venv/bin/python\"\n",
        )
        .unwrap();
        let config = Config::load(Some(&path), &["train.lr=0.5".into()]).unwrap();
        let json = config.export_json();
        let model = dir.path().join("model");
        assert_eq!(json["model"]["path"], model.display().to_string());
        assert_eq!(
            json["run"]["data"],
            dir.path().join("d.jsonl").display().to_string()
        );
        assert_eq!(json["run"]["steps"], 3);
        assert_eq!(json["run"]["group_size"], 4, "a default");
        assert_eq!(json["train"]["lr"], 0.5, "an override");
        assert_eq!(json["train"]["correction_high"], 3.0);
        assert_eq!(json["train"]["tis_threshold"], 3.0, "as given");
        assert_eq!(json["engine"]["kind"], "embedded");
        assert_eq!(json["report"]["tensorboard"], false);
        let python = dir.path().join("venv/bin/python");
        assert_eq!(config.report.python.as_deref(), Some(python.as_path()));
        assert_eq!(json["report"]["python"], python.display().to_string());
        assert_eq!(json["gateway"]["max_n"], 4);
        assert_eq!(json["gateway"]["admin_key"], "<redacted>");
        assert_eq!(json["plugin"]["judge"]["api_key"], "<redacted>");
        assert_eq!(json["plugin"]["judge"]["model"], "m");
        assert!(!json.to_string().contains("hunter2"));
        assert!(!is_secret("tokenizer") && !is_secret("max_tokens") && is_secret("API_KEY"));
        assert!(Path::new(json["model"]["path"].as_str().unwrap()).is_absolute());
    }
}
