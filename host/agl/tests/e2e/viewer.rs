//! The rollout viewer (`/ui`) in a real browser: a real `agl run` of the
//! calc harness fills a store, `agl serve` (auth on, the run's adapter set)
//! serves it, and headless Chromium (Debian's `chromium`, installed by
//! deploy/setup.sh) opens the run page, follows its links to a rollout
//! and to that rollout's first sample, and shows the trained-token counts
//! `agl plugin test` reports for the same rollout. A screenshot of each
//! page lands in `$CARGO_TARGET_TMPDIR/viewer`. The data routes refuse a
//! missing or wrong key and an agent's rollout token.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Child, Command, Stdio};

use serde_json::Value;

use crate::agl_run::{Setup, finish, gateway_url};

const AGL: &str = env!("CARGO_BIN_EXE_agl");
const KEY: &str = "viewer-admin-key";

/// Kills `agl serve` when the test ends, however it ends.
struct Serving(Child);

impl Drop for Serving {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `route` of the page at `base` as headless Chromium leaves the DOM once
/// the page's requests are answered; a screenshot of it as `NAME.png`.
fn page(base: &str, route: &str, name: &str, shots: &Path) -> String {
    let sep = if route.contains('?') { '&' } else { '?' };
    let url = format!("{base}/ui#{route}{sep}key={KEY}");
    let chromium = |mode: &[&str]| {
        Command::new("chromium")
            .args([
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--hide-scrollbars",
                "--virtual-time-budget=10000",
                "--window-size=1280,900",
            ])
            .args(mode)
            .arg(&url)
            .output()
            .expect("chromium runs (deploy/setup.sh installs Debian's chromium)")
    };
    let shot = shots.join(format!("{name}.png"));
    let out = chromium(&[&format!("--screenshot={}", shot.display())]);
    assert!(
        out.status.success() && shot.is_file(),
        "no screenshot of {url}"
    );
    let out = chromium(&["--dump-dom"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let dom = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        dom.contains("data-ready=\"1\""),
        "{url} did not render:\n{dom}"
    );
    assert!(!dom.contains("id=\"failure\""), "{url} failed:\n{dom}");
    dom
}

/// The value of the first `attr="..."` after `marker` in `dom`.
fn after<'a>(dom: &'a str, marker: &str, attr: &str) -> &'a str {
    let at = dom
        .find(marker)
        .unwrap_or_else(|| panic!("no {marker} in\n{dom}"));
    let rest = &dom[at..];
    let start = rest.find(&format!("{attr}=\"")).expect("attribute") + attr.len() + 2;
    let len = rest[start..].find('"').expect("closing quote");
    &rest[start..start + len]
}

/// Trained tokens per rollout and per (rollout, sample), as `agl plugin
/// test --json` reports them for the run's exported rollouts.
fn plugin_test_counts(
    config: &Path,
    out: &Path,
) -> (BTreeMap<String, u64>, BTreeMap<(String, u64), u64>) {
    let db = out.join("agl.db");
    let rollouts = out.join("rollouts.jsonl");
    let status = Command::new(AGL)
        .args(["rollouts", "export", "--db"])
        .arg(&db)
        .arg("--out")
        .arg(&rollouts)
        .status()
        .unwrap();
    assert!(status.success());
    let adapter = crate::support::built_plugin("trajectory");
    let tested = Command::new(AGL)
        .arg("--config")
        .arg(config)
        .args([
            "plugin",
            "test",
            "--json",
            "--plugin",
            &adapter,
            "--rollouts",
        ])
        .arg(&rollouts)
        .output()
        .unwrap();
    assert!(
        tested.status.success(),
        "{}",
        String::from_utf8_lossy(&tested.stderr)
    );
    let (mut per_rollout, mut per_sample) = (BTreeMap::new(), BTreeMap::new());
    for line in String::from_utf8_lossy(&tested.stdout).lines() {
        let line: Value = serde_json::from_str(line).unwrap();
        let id = line["rollout_id"].as_str().unwrap().to_string();
        let trained: u64 = line["sample"]["trainable"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s["end"].as_u64().unwrap() - s["start"].as_u64().unwrap())
            .sum();
        *per_rollout.entry(id.clone()).or_default() += trained;
        per_sample.insert((id, line["sample_index"].as_u64().unwrap()), trained);
    }
    (per_rollout, per_sample)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_viewer_shows_what_the_trainer_learns_from() {
    let setup = Setup::new().await;
    let config = setup.config("view", "steps = 1\nmode = \"sync\"");
    finish(setup.spawn(&config, false));
    let out = setup.out("view");
    let (per_rollout, per_sample) = plugin_test_counts(&config, &out);

    let mut child = Command::new(AGL)
        .arg("--config")
        .arg(&config)
        .args(["-o", &format!("gateway.admin_key=\"{KEY}\"")])
        .args(["serve", "--db"])
        .arg(out.join("agl.db"))
        .env_remove("AGL_ADMIN_KEY")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("agl serve");
    let base = gateway_url(&mut child);
    let _serving = Serving(child);
    let shots = Path::new(env!("CARGO_TARGET_TMPDIR")).join("viewer");
    std::fs::create_dir_all(&shots).unwrap();

    // Run -> rollouts -> a rollout -> its first sample, by the page's links.
    let run = page(&base, "/", "run", &shots);
    assert!(run.contains("step records"), "{run}");
    assert!(run.contains("<svg"), "the run page plots its steps:\n{run}");
    let rollouts_route = after(&run, "id=\"to-rollouts\"", "href")
        .trim_start_matches('#')
        .to_string();
    let rollouts = page(
        &base,
        &format!("{rollouts_route}?mode=train"),
        "rollouts",
        &shots,
    );
    let rollout_route = after(&rollouts, "class=\"rollout\"", "href")
        .trim_start_matches('#')
        .to_string();
    let id = rollout_route.trim_start_matches("/rollout/").to_string();
    let rollout = page(&base, &rollout_route, "rollout", &shots);
    let shown: u64 = after(&rollout, "id=\"rollout-trained\"", "data-trained-tokens")
        .parse()
        .unwrap();
    assert!(shown > 0);
    assert_eq!(
        Some(&shown),
        per_rollout.get(&id),
        "rollout {id}: the viewer and agl plugin test agree"
    );
    let sample_route = after(&rollout, "class=\"sample\"", "href")
        .trim_start_matches('#')
        .to_string();
    let sample = page(&base, &sample_route, "sample", &shots);
    let shown: u64 = after(&sample, "id=\"sample-trained\"", "data-trained-tokens")
        .parse()
        .unwrap();
    assert_eq!(
        Some(&shown),
        per_sample.get(&(id.clone(), 0)),
        "sample 0 of {id}"
    );
    assert!(sample.contains("class=\"trained\""), "{sample}");

    // The data routes are the management API's: admin key only.
    let http = reqwest::Client::new();
    let token = http
        .get(format!("{base}/v1/rollouts/{id}"))
        .bearer_auth(KEY)
        .send()
        .await
        .unwrap()
        .json::<Value>()
        .await
        .unwrap()["token"]
        .as_str()
        .unwrap()
        .to_string();
    for path in [
        "/v1/steps".to_string(),
        format!("/v1/rollouts/{id}/samples"),
    ] {
        let status = |key: Option<&str>| {
            let mut req = http.get(format!("{base}{path}"));
            if let Some(key) = key {
                req = req.bearer_auth(key);
            }
            async move { req.send().await.unwrap().status().as_u16() }
        };
        assert_eq!(status(Some(KEY)).await, 200, "{path}");
        assert_eq!(status(None).await, 401, "{path}");
        assert_eq!(status(Some("wrong")).await, 401, "{path}");
        assert_eq!(status(Some(&token)).await, 403, "{path}: an agent's token");
    }
    // The page itself holds no data: served to anyone, it asks for the key.
    let ui = http.get(format!("{base}/ui")).send().await.unwrap();
    assert_eq!(ui.status(), 200);
    assert!(ui.text().await.unwrap().contains("Admin key"));
}
