//! The crate layering ARCHITECTURE.md states, checked on `cargo metadata`:
//! the store, gateway, controller, plugin host and wire crates never link
//! libtorch (the trainer crates, tch, torch-sys) even indirectly, the
//! trainer crates point one way (model <- engine, model <- rl) and know
//! nothing of HTTP, plugins know only the WIT contract and the sample rules
//! (`agl-samples`, which knows no other workspace crate), and
//! no cycle runs through workspace crates, dev-dependencies included; and,
//! inside the crates that hold the most modules, no circle of imports.

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
    "agl-samples",
    "agl-client",
    "agl-controller",
    "agl-models",
    "agl-testengine",
];
const TORCH: &[&str] = &["agl-model", "agl-engine", "agl-rl", "tch", "torch-sys"];
/// HTTP crates, which the trainer crates never link.
const HTTP: &[&str] = &["hyper", "axum", "reqwest", "agl-wire", "agl-gateway"];

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
    assert!(engine.keys().any(|d| g.names[d] == "agl-engine"));
}

/// agl-model is the base of the trainer crates: the engine and the RL
/// update build on it and not on each other, and none speaks HTTP.
#[test]
fn trainer_crates_point_one_way_and_know_no_http() {
    let g = metadata();
    let links = |from: &str, to: &str| {
        g.linked(g.id(from))
            .into_iter()
            .find(|(d, _)| g.names[d] == to)
            .map(|(_, path)| path.join(" -> "))
    };
    for (from, to) in [
        ("agl-model", "agl-engine"),
        ("agl-model", "agl-rl"),
        ("agl-engine", "agl-rl"),
        ("agl-rl", "agl-engine"),
    ] {
        assert_eq!(links(from, to), None, "{from} must not link {to}");
    }
    for from in ["agl-model", "agl-engine", "agl-rl"] {
        for to in HTTP {
            assert_eq!(links(from, to), None, "{from} must not link {to}");
        }
    }
    // And the check can fail: the engine and the RL update do build on the model.
    assert!(links("agl-engine", "agl-model").is_some());
    assert!(links("agl-rl", "agl-model").is_some());
}

#[test]
fn plugins_know_only_the_wit_contract() {
    let g = metadata();
    let guests: Vec<&String> = g.members.iter().filter(|id| g.is_guest(id)).collect();
    assert!(
        guests.len() > 3,
        "the SDK and the built-in plugins are guests"
    );
    // The sample rules the host runs for its guests, compiled into the SDK
    // too: pure, they link no other workspace crate.
    let rules = g.id("agl-samples");
    for (dep, path) in g.linked(rules) {
        assert!(
            !g.members.contains(&dep),
            "agl-samples depends on workspace crate {}: {}",
            g.names[&dep],
            path.join(" -> ")
        );
    }
    for id in guests {
        for (dep, path) in g.linked(id) {
            assert!(
                !g.members.contains(&dep) || g.is_guest(&dep) || dep == rules,
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

/// The top-level modules of a crate's `src` (a file or a folder) and the
/// other top-level modules each names through `crate::` (or, in its own top
/// file, `super::`), braced groups included, in product code: comments and
/// a trailing `#[cfg(test)] mod tests` are not read.
fn module_imports(crate_dir: &str) -> BTreeMap<String, BTreeSet<String>> {
    let src = repo_root().join(crate_dir).join("src");
    let mut modules: BTreeMap<String, Vec<(std::path::PathBuf, bool)>> = BTreeMap::new();
    for entry in std::fs::read_dir(&src).expect("src").flatten() {
        let path = entry.path();
        let name = path.file_stem().unwrap().to_string_lossy().into_owned();
        // The crate root (and the binary's own `main.rs`, `cli/`) sit on top of all.
        if name == "main" || name == "cli" || name == "lib" {
            continue;
        }
        let files = if path.is_dir() {
            let top = path.join("mod.rs");
            rust_files(&path)
                .into_iter()
                .map(|f| {
                    let is_top = f == top;
                    (f, is_top)
                })
                .collect()
        } else if path.extension().is_some_and(|e| e == "rs") {
            vec![(path, true)]
        } else {
            continue;
        };
        modules.insert(name, files);
    }
    let names: BTreeSet<String> = modules.keys().cloned().collect();
    modules
        .into_iter()
        .map(|(name, files)| {
            let mut uses = BTreeSet::new();
            for (file, top) in files {
                let text = product_code(&std::fs::read_to_string(&file).expect("read"));
                let mut used = paths_after(&text, "crate::");
                if top {
                    used.extend(paths_after(&text, "super::"));
                }
                uses.extend(used.into_iter().filter(|u| *u != name && names.contains(u)));
            }
            (name, uses)
        })
        .collect()
}

/// A file without its comments and its trailing test module.
fn product_code(text: &str) -> String {
    let text = text
        .find("#[cfg(test)]\nmod tests")
        .map_or(text, |at| &text[..at]);
    text.lines()
        .map(|l| l.split("//").next().unwrap_or(""))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The first segment of each path after `prefix`: `prefix::a::b` gives `a`,
/// `prefix::{a, b::c}` gives `a` and `b`.
fn paths_after(text: &str, prefix: &str) -> Vec<String> {
    let ident = |s: &str| -> String {
        s.trim_start()
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect()
    };
    let mut out = Vec::new();
    for (at, _) in text.match_indices(prefix) {
        let rest = &text[at + prefix.len()..];
        let Some(group) = rest.strip_prefix('{') else {
            out.push(ident(rest));
            continue;
        };
        let (mut depth, mut item_start) = (0, 0);
        for (i, c) in group.char_indices() {
            match c {
                '{' => depth += 1,
                '}' if depth == 0 => {
                    out.push(ident(&group[item_start..i]));
                    break;
                }
                '}' => depth -= 1,
                ',' if depth == 0 => {
                    out.push(ident(&group[item_start..i]));
                    item_start = i + 1;
                }
                _ => {}
            }
        }
    }
    out
}

/// The modules of a circle of imports, if there is one.
fn circle(imports: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        g: &BTreeMap<String, BTreeSet<String>>,
        m: &str,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(at) = path.iter().position(|p| p == m) {
            let mut c = path[at..].to_vec();
            c.push(m.to_string());
            return Some(c);
        }
        if done.contains(m) {
            return None;
        }
        path.push(m.to_string());
        for dep in &g[m] {
            if let Some(c) = visit(g, dep, path, done) {
                return Some(c);
            }
        }
        path.pop();
        done.insert(m.to_string());
        None
    }
    let mut done = BTreeSet::new();
    imports
        .keys()
        .find_map(|m| visit(imports, m, &mut Vec::new(), &mut done))
}

/// No circle of imports between the top-level modules of the crates with
/// the most of them: each module can be read (and changed) knowing only
/// those below it.
#[test]
fn no_import_circle_inside_the_larger_crates() {
    for dir in [
        "host/gateway",
        "host/conversation",
        "host/store",
        "host/plugin-host",
        "host/samples",
        "trainer/model",
        "trainer/engine",
        "trainer/rl",
    ] {
        let imports = module_imports(dir);
        assert!(imports.len() >= 2, "{dir}: {imports:?}");
        if let Some(c) = circle(&imports) {
            panic!("{dir}: module circle {}", c.join(" -> "));
        }
    }
    // And the check can fail.
    let two = BTreeMap::from([
        ("a".to_string(), BTreeSet::from(["b".to_string()])),
        ("b".to_string(), BTreeSet::from(["a".to_string()])),
    ]);
    assert!(circle(&two).is_some());
    assert_eq!(
        paths_after("use super::{a, b::{c, d}, e};", "super::"),
        ["a", "b", "e"]
    );
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
    let imports = module_imports("host/agl");
    for expected in [
        "assembly", "config", "link", "plugins", "policy", "run", "viewer",
    ] {
        assert!(
            imports.contains_key(expected),
            "module {expected}: {imports:?}"
        );
    }
    if let Some(c) = circle(&imports) {
        panic!("module circle: {}", c.join(" -> "));
    }
    assert!(
        imports["config"].is_empty(),
        "config: {:?}",
        imports["config"]
    );
    for part in ["assembly", "plugins", "policy", "viewer", "link"] {
        assert!(!imports[part].contains("run"), "{part} imports run");
    }
}
