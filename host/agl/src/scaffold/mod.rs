//! `agl plugin new NAME`: writes a standalone sample-adapter crate built on
//! the guest SDK, which passes its own test and builds to a component
//! (`--lang python`: a Python plugin folder, see [`python`]).
//!
//! The SDKs travel inside the binary (their sources and `wit/`, listed by
//! `build.rs`): [`installed_sdk`] writes them out once per agl version and
//! content under `~/.cache/agl/sdk/`, so `agl plugin new` and `agl plugin
//! build` work on a machine with no agl checkout.

pub mod python;

use std::path::{Path, PathBuf};

use anyhow::{Context, bail};

include!(concat!(env!("OUT_DIR"), "/sdk_files.rs"));

/// The SDK's dependencies, as the workspace pins them (a test checks these
/// against `Cargo.toml`).
const SDK_DEPS: [(&str, &str); 3] = [
    ("wit-bindgen", "0.63.0"),
    ("serde", "1"),
    ("serde_json", "1.0.154"),
];

/// Writes the embedded SDKs under `cache` (default `~/.cache/agl/sdk`) if
/// they are not there yet and returns the Rust SDK crate's directory
/// (`plugins/sdk` of the written tree; the Python SDK is in
/// `plugins/python`, the contract in `wit`).
pub fn installed_sdk(cache: Option<&Path>) -> anyhow::Result<PathBuf> {
    let base = match cache {
        Some(c) => c.to_path_buf(),
        None => {
            let home = std::env::var_os("HOME").context("HOME is not set; pass --sdk")?;
            PathBuf::from(home).join(".cache/agl/sdk")
        }
    };
    let mut hasher = blake3::Hasher::new();
    for (path, text) in SDK_FILES {
        hasher.update(path.as_bytes());
        hasher.update(text.as_bytes());
    }
    let version = env!("CARGO_PKG_VERSION");
    let root = base.join(format!(
        "agl-plugin-{version}-{}",
        &hasher.finalize().to_hex()[..12]
    ));
    let crate_dir = root.join("plugins/sdk");
    if crate_dir.join("Cargo.toml").is_file() {
        return Ok(crate_dir);
    }
    // Written beside, then renamed: a half-written SDK is never used.
    let tmp = base.join(format!(".tmp-{}-{}", std::process::id(), version));
    let _ = std::fs::remove_dir_all(&tmp);
    for (path, text) in SDK_FILES {
        let file = tmp.join(path);
        std::fs::create_dir_all(file.parent().expect("files have a folder"))
            .with_context(|| format!("cannot create {}", tmp.display()))?;
        std::fs::write(&file, text).with_context(|| format!("cannot write {}", file.display()))?;
    }
    let manifests = [
        (
            "plugins/sdk/Cargo.toml",
            include_str!("../../templates/sdk/Cargo.toml.tmpl"),
        ),
        (
            "host/samples/Cargo.toml",
            include_str!("../../templates/sdk/samples.Cargo.toml.tmpl"),
        ),
    ];
    for (path, template) in manifests {
        let mut manifest = template
            .replace("{{agl_version}}", version)
            .replace("{{version}}", version);
        for (dep, v) in SDK_DEPS {
            manifest = manifest.replace(&format!("{{{{{dep}}}}}"), v);
        }
        std::fs::write(tmp.join(path), manifest)?;
    }
    match std::fs::rename(&tmp, &root) {
        Ok(()) => {}
        // Another agl wrote the same SDK meanwhile: use theirs.
        Err(_) if crate_dir.join("Cargo.toml").is_file() => {
            let _ = std::fs::remove_dir_all(&tmp);
        }
        Err(e) => return Err(e).with_context(|| format!("cannot create {}", root.display())),
    }
    Ok(crate_dir)
}

/// Files of the new crate: (path inside it, template).
const FILES: [(&str, &str); 5] = [
    (
        "Cargo.toml",
        include_str!("../../templates/plugin/Cargo.toml.tmpl"),
    ),
    (
        ".cargo/config.toml",
        include_str!("../../templates/plugin/cargo-config.toml.tmpl"),
    ),
    (
        ".gitignore",
        include_str!("../../templates/plugin/gitignore.tmpl"),
    ),
    (
        "README.md",
        include_str!("../../templates/plugin/README.md.tmpl"),
    ),
    (
        "src/lib.rs",
        include_str!("../../templates/plugin/lib.rs.tmpl"),
    ),
];

/// Names cargo or the SDK dependency would refuse.
const RESERVED: [&str; 6] = ["agl-plugin", "test", "std", "core", "alloc", "proc-macro"];

/// Creates crate `name` in `dir/name` depending on the SDK at `sdk_path`
/// and returns its directory. Refuses an invalid name or an existing path.
pub fn scaffold(name: &str, dir: &Path, sdk_path: &Path) -> anyhow::Result<PathBuf> {
    let root = new_folder(name, dir)?;
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

/// Creates the empty folder `dir/name` of a new plugin after checking the
/// name; refuses a path that exists.
pub(crate) fn new_folder(name: &str, dir: &Path) -> anyhow::Result<PathBuf> {
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
    fn the_embedded_sdk_is_the_workspace_sdk() {
        let workspace: toml::Table =
            toml::from_str(include_str!("../../../../Cargo.toml")).unwrap();
        let deps = workspace["workspace"]["dependencies"].as_table().unwrap();
        for (dep, want) in SDK_DEPS {
            let entry = &deps[dep];
            let have = entry
                .as_str()
                .or_else(|| entry.get("version").and_then(|v| v.as_str()))
                .unwrap();
            assert_eq!(
                have, want,
                "workspace pins {dep} {have}, the embedded SDK {want}"
            );
        }
        let sdk: toml::Table =
            toml::from_str(include_str!("../../../../plugins/sdk/Cargo.toml")).unwrap();
        let used: Vec<&String> = sdk["dependencies"].as_table().unwrap().keys().collect();
        assert_eq!(
            used.len(),
            SDK_DEPS.len() + 1,
            "SDK dependencies changed (agl-samples and {SDK_DEPS:?}): {used:?}"
        );
        assert!(SDK_FILES.iter().any(|(p, _)| *p == "wit/agl.wit"));
        assert!(
            SDK_FILES
                .iter()
                .any(|(p, _)| *p == "plugins/sdk/src/lib.rs")
        );

        let tmp = tempfile::tempdir().unwrap();
        let dir = installed_sdk(Some(tmp.path())).unwrap();
        assert!(dir.join("src/bindings.rs").is_file());
        assert!(dir.join("../../host/samples/Cargo.toml").is_file());
        assert!(
            dir.join("../../wit/agl.wit").is_file(),
            "bindings find the WIT at ../../wit"
        );
        let manifest: toml::Table =
            toml::from_str(&std::fs::read_to_string(dir.join("Cargo.toml")).unwrap()).unwrap();
        assert_eq!(
            manifest["dependencies"]["wit-bindgen"].as_str(),
            Some("0.63.0")
        );
        // A second call reuses the first copy.
        assert_eq!(installed_sdk(Some(tmp.path())).unwrap(), dir);
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
