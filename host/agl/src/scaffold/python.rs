//! `agl plugin new --lang python NAME`: a Python plugin folder
//! (`plugin.toml`, `app.py`, `test_app.py`, README) that `agl plugin build`
//! turns into a component, its test run first.

use std::path::{Path, PathBuf};

use anyhow::Context;

/// What a scaffolded plugin does: score rollouts or build their samples.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Kind {
    Adapter,
    Reward,
}

impl Kind {
    /// The WIT world the plugin exports.
    pub fn world(self) -> &'static str {
        match self {
            Kind::Adapter => "sample-adapter",
            Kind::Reward => "reward",
        }
    }
}

/// Creates the plugin folder `dir/name` and returns it. Refuses an invalid
/// name or an existing path.
pub fn scaffold(name: &str, kind: Kind, dir: &Path) -> anyhow::Result<PathBuf> {
    let root = super::new_folder(name, dir)?;
    let (app, test, description, try_flags, run_flag, reload_flag) = match kind {
        Kind::Reward => (
            include_str!("../../templates/python/reward.py.tmpl"),
            include_str!("../../templates/python/reward_test.py.tmpl"),
            "1.0 when the final answer contains the input's answer",
            format!("--reward {name}.wasm"),
            "reward",
            "reward",
        ),
        Kind::Adapter => (
            include_str!("../../templates/python/adapter.py.tmpl"),
            include_str!("../../templates/python/adapter_test.py.tmpl"),
            "merges each agent's calls by token prefix, skipping configured agents",
            format!("--plugin {name}.wasm"),
            "plugin",
            "adapter",
        ),
    };
    let files = [
        (
            "plugin.toml",
            include_str!("../../templates/python/plugin.toml.tmpl"),
        ),
        ("app.py", app),
        ("test_app.py", test),
        (
            "README.md",
            include_str!("../../templates/python/README.md.tmpl"),
        ),
        (
            ".gitignore",
            include_str!("../../templates/python/gitignore.tmpl"),
        ),
    ];
    for (path, template) in files {
        let text = template
            .replace("{{name}}", name)
            .replace("{{world}}", kind.world())
            .replace("{{description}}", description)
            .replace("{{try_flags}}", &try_flags)
            .replace("{{run_flag}}", run_flag)
            .replace("{{reload_flag}}", reload_flag);
        let file = root.join(path);
        std::fs::write(&file, text).with_context(|| format!("cannot write {}", file.display()))?;
    }
    Ok(root)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_a_plugin_folder_of_its_kind_and_refuses_to_overwrite_it() {
        let tmp = tempfile::tempdir().unwrap();
        for (name, kind) in [("my-reward", Kind::Reward), ("my-adapter", Kind::Adapter)] {
            let root = scaffold(name, kind, tmp.path()).unwrap();
            let manifest: toml::Table =
                toml::from_str(&std::fs::read_to_string(root.join("plugin.toml")).unwrap())
                    .unwrap();
            assert_eq!(manifest["name"].as_str(), Some(name));
            assert_eq!(manifest["world"].as_str(), Some(kind.world()));
            let app = std::fs::read_to_string(root.join("app.py")).unwrap();
            let decorator = if kind == Kind::Reward {
                "@reward"
            } else {
                "@adapter"
            };
            assert!(app.contains(decorator), "{app}");
            assert!(root.join("test_app.py").is_file() && root.join(".gitignore").is_file());
            let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
            assert!(!readme.contains("{{"), "{readme}");
            let again = scaffold(name, kind, tmp.path()).unwrap_err();
            assert!(again.to_string().contains("already exists"), "{again}");
        }
        assert!(scaffold("Bad_Name", Kind::Reward, tmp.path()).is_err());
    }
}
