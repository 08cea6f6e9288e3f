//! `agl plugin new NAME`: writes a standalone sample-adapter crate built on
//! the guest SDK, which passes its own test and builds to a component.

use std::path::{Path, PathBuf};

use anyhow::{Context, bail};

/// Files of the new crate: (path inside it, template).
const FILES: [(&str, &str); 5] = [
    (
        "Cargo.toml",
        include_str!("../templates/plugin/Cargo.toml.tmpl"),
    ),
    (
        ".cargo/config.toml",
        include_str!("../templates/plugin/cargo-config.toml.tmpl"),
    ),
    (
        ".gitignore",
        include_str!("../templates/plugin/gitignore.tmpl"),
    ),
    (
        "README.md",
        include_str!("../templates/plugin/README.md.tmpl"),
    ),
    (
        "src/lib.rs",
        include_str!("../templates/plugin/lib.rs.tmpl"),
    ),
];

/// Names cargo or the SDK dependency would refuse.
const RESERVED: [&str; 6] = ["agl-plugin", "test", "std", "core", "alloc", "proc-macro"];

/// Creates crate `name` in `dir/name` depending on the SDK at `sdk_path`
/// and returns its directory. Refuses an invalid name or an existing path.
pub fn scaffold(name: &str, dir: &Path, sdk_path: &Path) -> anyhow::Result<PathBuf> {
    validate_name(name)?;
    let root = dir.join(name);
    if root.exists() {
        bail!(
            "{} already exists; choose another name or directory",
            root.display()
        );
    }
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    // `create_dir`, not `_all`: it fails if the directory appeared meanwhile.
    std::fs::create_dir(&root).with_context(|| format!("cannot create {}", root.display()))?;
    let sdk = toml::Value::String(sdk_path.display().to_string()).to_string();
    for (path, template) in FILES {
        let text = template
            .replace("{{name}}", name)
            .replace("{{crate_name}}", &name.replace('-', "_"))
            .replace("{{sdk_path}}", &sdk);
        let file = root.join(path);
        if let Some(parent) = file.parent() {
            std::fs::create_dir_all(parent)
                .with_context(|| format!("cannot create {}", parent.display()))?;
        }
        std::fs::write(&file, text).with_context(|| format!("cannot write {}", file.display()))?;
    }
    Ok(root)
}

/// A plugin name: lowercase ASCII letters, digits and single `-` between
/// them, starting with a letter (a valid crate name and `.wasm` stem).
fn validate_name(name: &str) -> anyhow::Result<()> {
    let well_formed = name.starts_with(|c: char| c.is_ascii_lowercase())
        && !name.ends_with('-')
        && !name.contains("--")
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        && name.len() <= 64;
    if !well_formed {
        bail!(
            "invalid plugin name {name:?}: use lowercase letters, digits and '-', \
             starting with a letter (e.g. `my-harness`)"
        );
    }
    if RESERVED.contains(&name) {
        bail!("invalid plugin name {name:?}: reserved");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_validated() {
        for good in ["a", "my-harness", "swe2", "x-1-y"] {
            assert!(validate_name(good).is_ok(), "{good}");
        }
        for bad in [
            "",
            "My",
            "2fast",
            "-a",
            "a-",
            "a--b",
            "a_b",
            "a.b",
            "a/b",
            "agl-plugin",
            "test",
        ] {
            assert!(validate_name(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn writes_the_crate_and_refuses_to_overwrite_it() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let sdk = Path::new("/opt/agl \"sdk\"");
        let root = scaffold("my-harness", tmp.path(), sdk).expect("scaffold");
        assert_eq!(root, tmp.path().join("my-harness"));
        let manifest = std::fs::read_to_string(root.join("Cargo.toml")).expect("manifest");
        let parsed: toml::Table = toml::from_str(&manifest).expect("valid TOML");
        assert_eq!(parsed["package"]["name"].as_str(), Some("my-harness"));
        assert_eq!(
            parsed["dependencies"]["agl-plugin"]["path"].as_str(),
            Some("/opt/agl \"sdk\"")
        );
        assert!(parsed.contains_key("workspace"));
        let readme = std::fs::read_to_string(root.join("README.md")).expect("readme");
        assert!(readme.contains("release/my_harness.wasm"), "{readme}");
        assert!(root.join("src/lib.rs").is_file() && root.join(".cargo/config.toml").is_file());

        let again = scaffold("my-harness", tmp.path(), sdk).unwrap_err();
        assert!(again.to_string().contains("already exists"), "{again}");
    }
}
