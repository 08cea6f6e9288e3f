//! The crate layering ARCHITECTURE.md states, checked on `cargo metadata`:
//! the store, gateway, controller, plugin host and wire crates never link
//! libtorch (agl-trainer, tch, torch-sys) even indirectly, plugins know only
//! the WIT contract (no host crate), and no cycle runs through workspace
//! crates, dev-dependencies included.

use std::collections::{BTreeMap, BTreeSet};
use std::process::Command;

use serde_json::Value;

use crate::support::repo_root;

/// Crates that must stay free of libtorch.
const TORCH_FREE: &[&str] = &[
    "agl-wire",
    "agl-tokenizer",
    "agl-conversation",
    "agl-store",
    "agl-gateway",
    "agl-plugin-host",
    "agl-client",
    "agl-controller",
    "agl-models",
    "agl-testengine",
];
const TORCH: &[&str] = &["agl-trainer", "tch", "torch-sys"];

struct Graph {
    /// Package id -> name.
    names: BTreeMap<String, String>,
    /// Package id -> (dependency id, is it only a dev-dependency).
    edges: BTreeMap<String, Vec<(String, bool)>>,
    members: BTreeSet<String>,
}

/// This machine's target triple (what the workspace is built for here).
fn host_triple() -> String {
    let out = Command::new("rustc")
        .arg("-vV")
        .output()
        .expect("run rustc -vV");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|l| l.strip_prefix("host: "))
        .expect("rustc -vV names the host")
        .to_string()
}

fn metadata() -> Graph {
    // Filtered to this platform: resolving every platform would need
    // crates (Windows, wasm-bindgen) that are never downloaded here.
    let out = Command::new(env!("CARGO"))
        .args(["metadata", "--format-version", "1", "--offline"])
        .arg("--filter-platform")
        .arg(host_triple())
        .arg("--manifest-path")
        .arg(repo_root().join("Cargo.toml"))
        .output()
        .expect("run cargo metadata");
    assert!(
        out.status.success(),
        "cargo metadata: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let meta: Value = serde_json::from_slice(&out.stdout).expect("metadata JSON");
    let names = meta["packages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            (
                p["id"].as_str().unwrap().to_string(),
                p["name"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    let members = meta["workspace_members"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m.as_str().unwrap().to_string())
        .collect();
    let mut edges = BTreeMap::new();
    for node in meta["resolve"]["nodes"].as_array().unwrap() {
        let deps = node["deps"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| {
                let dev_only = d["dep_kinds"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .all(|k| k["kind"].as_str() == Some("dev"));
                (d["pkg"].as_str().unwrap().to_string(), dev_only)
            })
            .collect();
        edges.insert(node["id"].as_str().unwrap().to_string(), deps);
    }
    Graph {
        names,
        edges,
        members,
    }
}

impl Graph {
    fn id(&self, name: &str) -> &str {
        self.names
            .iter()
            .find(|(id, n)| *n == name && self.members.contains(*id))
            .map(|(id, _)| id.as_str())
            .unwrap_or_else(|| panic!("{name} is not a workspace member"))
    }

    /// A Wasm guest: the SDK, or a crate built on it (or on wit-bindgen).
    fn is_guest(&self, id: &str) -> bool {
        self.names[id] == "agl-plugin"
            || self.edges[id].iter().any(|(d, dev_only)| {
                !dev_only && (self.names[d] == "agl-plugin" || self.names[d] == "wit-bindgen")
            })
    }

    /// Every package `from` links (normal and build dependencies, not dev),
    /// with the path that reaches it.
    fn linked(&self, from: &str) -> BTreeMap<String, Vec<String>> {
        let mut seen = BTreeMap::new();
        let mut stack = vec![(from.to_string(), vec![self.names[from].clone()])];
        while let Some((id, path)) = stack.pop() {
            for (dep, dev_only) in &self.edges[&id] {
                if *dev_only || seen.contains_key(dep) {
                    continue;
                }
                let mut p = path.clone();
                p.push(self.names[dep].clone());
                seen.insert(dep.clone(), p.clone());
                stack.push((dep.clone(), p));
            }
        }
        seen
    }
}

#[test]
fn subsystem_crates_never_link_libtorch() {
    let g = metadata();
    for name in TORCH_FREE {
        for (dep, path) in g.linked(g.id(name)) {
            assert!(
                !TORCH.contains(&g.names[&dep].as_str()),
                "{name} links libtorch: {}",
                path.join(" -> ")
            );
        }
    }
    // And the check can fail: the engine does link it.
    let engine = g.linked(g.id("agl-inference"));
    assert!(engine.keys().any(|d| g.names[d] == "agl-trainer"));
}

#[test]
fn plugins_know_only_the_wit_contract() {
    let g = metadata();
    let guests: Vec<&String> = g.members.iter().filter(|id| g.is_guest(id)).collect();
    assert!(
        guests.len() > 3,
        "the SDK and the built-in plugins are guests"
    );
    for id in guests {
        for (dep, path) in g.linked(id) {
            assert!(
                !g.members.contains(&dep) || g.is_guest(&dep),
                "plugin {} depends on host crate {}: {}",
                g.names[id],
                g.names[&dep],
                path.join(" -> ")
            );
        }
    }
}

#[test]
fn no_cycle_through_workspace_crates() {
    let g = metadata();
    // Depth-first search over workspace members, dev-dependencies included
    // (cargo allows a dev-dependency cycle, which builds a crate twice).
    fn visit<'a>(g: &'a Graph, id: &'a str, path: &mut Vec<&'a str>, done: &mut BTreeSet<&'a str>) {
        if let Some(at) = path.iter().position(|p| *p == id) {
            let cycle: Vec<&str> = path[at..].iter().map(|p| g.names[*p].as_str()).collect();
            panic!("crate cycle: {} -> {}", cycle.join(" -> "), g.names[id]);
        }
        if !done.insert(id) {
            return;
        }
        path.push(id);
        for (dep, _) in &g.edges[id] {
            if g.members.contains(dep) {
                visit(g, dep, path, done);
            }
        }
        path.pop();
    }
    let mut done = BTreeSet::new();
    for id in &g.members {
        visit(&g, id, &mut Vec::new(), &mut done);
    }
}

/// The top-level modules of `host/agl/src` (a file or a folder) and the
/// other top-level modules each names through `crate::`.
fn module_imports() -> BTreeMap<String, BTreeSet<String>> {
    let src = repo_root().join("host/agl/src");
    let mut modules: BTreeMap<String, Vec<std::path::PathBuf>> = BTreeMap::new();
    for entry in std::fs::read_dir(&src).expect("src").flatten() {
        let path = entry.path();
        let name = path.file_stem().unwrap().to_string_lossy().into_owned();
        // The binary's own modules (`main.rs`, `cli/`) sit on top of all.
        if name == "main" || name == "cli" || name == "lib" {
            continue;
        }
        let files = if path.is_dir() {
            rust_files(&path)
        } else {
            vec![path]
        };
        modules.insert(name, files);
    }
    let names: BTreeSet<String> = modules.keys().cloned().collect();
    modules
        .into_iter()
        .map(|(name, files)| {
            let mut uses = BTreeSet::new();
            for file in files {
                let text = std::fs::read_to_string(&file).expect("read");
                for (at, _) in text.match_indices("crate::") {
                    let rest = &text[at + "crate::".len()..];
                    let used: String = rest
                        .chars()
                        .take_while(|c| c.is_alphanumeric() || *c == '_')
                        .collect();
                    if used != name && names.contains(&used) {
                        uses.insert(used);
                    }
                }
            }
            (name, uses)
        })
        .collect()
}

fn rust_files(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).expect("dir").flatten() {
        let path = entry.path();
        if path.is_dir() {
            out.extend(rust_files(&path));
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
    out
}

/// No circle of imports between `host/agl`'s modules: the config knows no
/// other module, the assembly and the parts it builds know nothing of the
/// training loop, and only the loop (`run`) knows them all.
#[test]
fn host_agl_modules_import_in_one_direction() {
    let imports = module_imports();
    for expected in [
        "assembly", "config", "link", "plugins", "policy", "run", "trainer", "viewer",
    ] {
        assert!(
            imports.contains_key(expected),
            "module {expected}: {imports:?}"
        );
    }
    fn visit<'a>(
        g: &'a BTreeMap<String, BTreeSet<String>>,
        m: &'a str,
        path: &mut Vec<&'a str>,
        done: &mut BTreeSet<&'a str>,
    ) {
        if let Some(at) = path.iter().position(|p| *p == m) {
            panic!("module circle: {} -> {m}", path[at..].join(" -> "));
        }
        if done.contains(m) {
            return;
        }
        path.push(m);
        for dep in &g[m] {
            visit(g, dep, path, done);
        }
        path.pop();
        done.insert(m);
    }
    let mut done = BTreeSet::new();
    for m in imports.keys() {
        visit(&imports, m, &mut Vec::new(), &mut done);
    }
    assert!(
        imports["config"].is_empty(),
        "config: {:?}",
        imports["config"]
    );
    for part in ["assembly", "plugins", "policy", "viewer", "trainer", "link"] {
        assert!(!imports[part].contains("run"), "{part} imports run");
    }
}
