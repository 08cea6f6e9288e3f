//! `agl run` reporting: the metrics log on disk (round trip, resume
//! truncation, torn lines), the step lines and summary table, the PNG plot and the
//! trainer gauges on a real gateway's `/metrics`.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;
use std::sync::Arc;

use agl::run::report::{
    BREAK_OTHER, BREAK_RETOKENIZE, BREAK_TEMPLATE, Labels, MetricsLog, StepRecord, TrainerGauges,
    panels, plot, read_records, summary_lines, summary_table,
};
use agl_gateway::Gateway;
use agl_gateway::GatewayConfig;
use agl_store::Store;
use agl_wire::metrics::Figures;

/// A baseline and `steps` training records with distinct, varying values
/// (dyadic fractions: serde_json without `float_roundtrip` may misread the
/// last bit of others, e.g. `0.12` as `0.12000000000000001`).
fn run_records(steps: u64) -> Vec<StepRecord> {
    let mut out = vec![StepRecord {
        val_tool_use: Some(0.5),
        val_calls_per_rollout: Some(1.0),
        ..StepRecord::baseline(steps, 4.5, Some(0.25), 16)
    }];
    for step in 1..=steps {
        let s = step as usize;
        out.push(StepRecord {
            step,
            total_steps: steps,
            weight_version: step,
            elapsed_s: 4.5 + 30.0 * step as f64,
            step_s: 30.0 + step as f64,
            wait_s: 12.0 + step as f64,
            train_s: 15.5,
            drain_s: 0.25 * step as f64,
            reward_mean: Some(step as f64 / 8.0),
            val_reward: (step % 2 == 0).then_some(0.25 + step as f64 / 16.0),
            val_rollouts: if step % 2 == 0 { 16 } else { 0 },
            groups: 4,
            rollouts: 30 + s,
            samples: 40 + 2 * s,
            tokens: 1000 * s + 7,
            breaks: BTreeMap::from([
                (BREAK_RETOKENIZE.to_string(), s),
                (BREAK_TEMPLATE.to_string(), s % 2),
                (BREAK_OTHER.to_string(), 2 * s),
            ]),
            excluded_system: s % 3,
            excluded_no_reward: 1,
            plugin_failures: usize::from(step == 2),
            update: Figures(BTreeMap::from(
                [
                    ("loss", 1.0 / (1u64 << step) as f64),
                    ("clip_fraction", step as f64 / 128.0),
                    ("grad_norm", 2.0),
                    ("lr", 1e-6),
                    ("padding_waste", step as f64 / 64.0),
                    ("engine_kl", 1.5e-4),
                ]
                .map(|(k, v)| (k.to_string(), v)),
            )),
            micro_batches: 3,
            skipped_samples: s,
            calls_per_rollout: Some(1.0 + step as f64 / 4.0),
            tool_use: Some(step as f64 / 8.0),
            val_tool_use: (step % 2 == 0).then_some(0.5),
            val_calls_per_rollout: (step % 2 == 0).then_some(2.0),
            mean_staleness: 0.5,
            ..StepRecord::default()
        });
    }
    out
}

fn write_log(path: &Path, records: &[StepRecord]) {
    let mut log = MetricsLog::open(path, None).unwrap();
    for r in records {
        log.append(r).unwrap();
    }
}

#[test]
fn metrics_log_round_trips_every_field() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("run/metrics.jsonl");
    let records = run_records(4);
    write_log(&path, &records);
    let text = std::fs::read_to_string(&path).unwrap();
    assert_eq!(text.lines().count(), records.len(), "one line per record");
    assert_eq!(read_records(&path).unwrap(), records);

    // A new run (no resume) replaces the old log.
    write_log(&path, &records[..2]);
    assert_eq!(read_records(&path).unwrap(), records[..2]);
}

#[test]
fn resume_drops_steps_past_the_checkpoint_and_a_torn_line() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("metrics.jsonl");
    let records = run_records(6);
    write_log(&path, &records);
    // The crash tore the write of one more record.
    let extra = serde_json::to_string(&StepRecord {
        step: 7,
        ..StepRecord::default()
    })
    .unwrap();
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .open(&path)
        .unwrap();
    f.write_all(&extra.as_bytes()[..extra.len() / 2]).unwrap();
    drop(f);
    // Reading tolerates the torn tail.
    assert_eq!(read_records(&path).unwrap(), records);

    let checkpoint = 3;
    let mut log = MetricsLog::open(&path, Some(checkpoint)).unwrap();
    let kept: Vec<StepRecord> = records
        .iter()
        .filter(|r| r.step <= checkpoint)
        .cloned()
        .collect();
    assert_eq!(
        kept.len(),
        checkpoint as usize + 1,
        "baseline + steps 1..=3"
    );
    assert_eq!(read_records(&path).unwrap(), kept);
    assert!(!dir.path().join("metrics.jsonl.tmp").exists());

    // The resumed run logs step 4 again, with its new values.
    let mut redo = records[4].clone();
    redo.update.set("loss", 42.0);
    log.append(&redo).unwrap();
    let after = read_records(&path).unwrap();
    assert_eq!(after.len(), kept.len() + 1);
    assert_eq!(after.last(), Some(&redo));

    // Resuming where no log exists yet starts an empty one.
    let fresh = dir.path().join("none/metrics.jsonl");
    MetricsLog::open(&fresh, Some(2)).unwrap();
    assert_eq!(read_records(&fresh).unwrap(), vec![]);
}

#[test]
fn a_corrupt_line_before_the_last_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("metrics.jsonl");
    let good = serde_json::to_string(&run_records(1)[1]).unwrap();
    std::fs::write(&path, format!("{good}\n{{\"step\": oops\n{good}\n")).unwrap();
    let err = read_records(&path).unwrap_err().to_string();
    assert!(err.contains("metrics.jsonl:2"), "{err}");
    // ... and so resuming refuses to rewrite it.
    assert!(MetricsLog::open(&path, Some(5)).is_err());
}

#[test]
fn summary_lines_show_the_step_numbers_in_two_lines() {
    let records = run_records(4);
    let r = &records[2];
    let lines = summary_lines(r, true);
    assert_eq!(lines.lines().count(), 2, "{lines}");
    let expected = [
        format!("step {}/{} v{}", r.step, r.total_steps, r.weight_version),
        format!("reward {:.3}", r.reward_mean.unwrap()),
        format!("val {:.3} tool 50%", r.val_reward.unwrap()),
        "| tool 25% |".to_string(),
        format!(
            "{:.2} calls {:.2} samples per rollout",
            r.calls_per_rollout.unwrap(),
            r.samples as f64 / r.rollouts as f64
        ),
        format!(
            "breaks retok {} tmpl {} other {}",
            r.breaks_of(BREAK_RETOKENIZE),
            r.breaks_of(BREAK_TEMPLATE),
            r.breaks_of(BREAK_OTHER)
        ),
        format!("{} rollouts 2.0k tok", r.rollouts),
        format!("plugin failures {}", r.plugin_failures),
        format!(
            "wait {:.1}s train {:.1}s drain {:.1}s",
            r.wait_s, r.train_s, r.drain_s
        ),
        format!(
            "{} trained ({} zero-advantage skipped)",
            r.samples - r.skipped_samples,
            r.skipped_samples
        ),
        "grad 2.00".to_string(),
        "engine kl 1.5e-4".to_string(),
        format!(
            "excl sys {} noreward {}",
            r.excluded_system, r.excluded_no_reward
        ),
    ];
    for part in expected {
        assert!(lines.contains(&part), "{part:?} missing in {lines:?}");
    }
    // Odd steps have no validation; quiet counters stay out of the line;
    // a harness that never reported a tool use gets no tool column.
    let odd = summary_lines(&records[3], true);
    assert!(!odd.contains("val ") && !odd.contains("plugin"), "{odd}");
    assert!(odd.contains("reward 0.375"), "{odd}");
    let no_tools = summary_lines(r, false);
    assert!(!no_tools.contains("tool"), "{no_tools}");

    let base = summary_lines(&records[0], true);
    assert_eq!(
        base,
        "baseline v0 | val 0.250 tool 50% (16 rollouts, 1.00 calls/rollout) | 4.5s"
    );
}

/// The panels follow the data: a series with no point is left out of its
/// panel, a panel without a series is not drawn, and every panel the
/// README promises is there when its data is.
#[test]
fn the_plot_draws_a_panel_per_measured_figure_and_none_empty() {
    let lines = |records: &[StepRecord]| -> Vec<(&'static str, Vec<&'static str>)> {
        panels(records)
            .into_iter()
            .map(|p| (p.title, p.lines.iter().map(|(name, _, _)| *name).collect()))
            .collect()
    };
    assert_eq!(
        lines(&records_with_entropy(4)),
        [
            ("reward", vec!["train (mean)", "validation"]),
            ("tool use (share of rollouts)", vec!["train", "validation"]),
            (
                "per rollout",
                vec!["model calls", "samples", "chain breaks"]
            ),
            ("gradient norm (before clipping)", vec!["grad norm"]),
            ("entropy (nats per token)", vec!["entropy"]),
            // Only the KL is measured in these records: the gap, the
            // outside and corrected shares (all null) draw no line.
            ("trainer vs engine", vec!["KL(engine || trainer)"]),
        ]
    );
    let with_gap: Vec<StepRecord> = records_with_entropy(4)
        .into_iter()
        .map(|mut r| {
            if !r.is_baseline() {
                r.update.set("mismatch_mean", 1e-5);
            }
            if r.step == 3 {
                r.update.set("corrected_fraction", 0.125);
            }
            r
        })
        .collect();
    let gap = lines(&with_gap).pop().unwrap();
    assert_eq!(
        gap,
        (
            "trainer vs engine",
            vec![
                "KL(engine || trainer)",
                "mean |logprob gap|",
                "corrected share"
            ]
        )
    );
    let records = run_records(4);
    let drawn = panels(&records);
    let titles: Vec<&str> = drawn.iter().map(|p| p.title).collect();
    assert_eq!(
        titles,
        [
            "reward",
            "tool use (share of rollouts)",
            "per rollout",
            "gradient norm (before clipping)",
            "trainer vs engine"
        ],
        "entropy is None in these records: no panel"
    );
    for p in &drawn {
        for (name, points, _) in &p.lines {
            assert!(!points.is_empty(), "{}: {name} is empty", p.title);
        }
    }
    // The loss is not drawn (~0 by construction with one step per batch).
    assert!(!titles.iter().any(|t| t.contains("loss")));
    // A harness without tools: no tool panel.
    let plain: Vec<StepRecord> = records
        .iter()
        .cloned()
        .map(|r| StepRecord {
            tool_use: Some(0.0),
            val_tool_use: None,
            ..r
        })
        .collect();
    assert!(
        !panels(&plain)
            .iter()
            .any(|p| p.title.starts_with("tool use"))
    );
}

#[test]
fn summary_table_sums_the_run() {
    let records = run_records(5);
    let table = summary_table(&records);
    let train = &records[1..];
    let sum = |f: fn(&StepRecord) -> usize| train.iter().map(f).sum::<usize>();
    let mean = |f: fn(&StepRecord) -> f64| train.iter().map(f).sum::<f64>() / train.len() as f64;
    let best = records
        .iter()
        .filter_map(|r| r.val_reward.map(|v| (v, r.step)))
        .max_by(|a, b| a.0.total_cmp(&b.0))
        .unwrap();
    let final_val = train.iter().rev().find_map(|r| r.val_reward).unwrap();
    let expected = [
        format!(
            "steps                {} of {} (weight version {})",
            train.len(),
            train[4].total_steps,
            train[4].weight_version
        ),
        // The last record's elapsed_s, 154.5 s, rounded.
        "wall time            2m 35s".to_string(),
        format!(
            "baseline {:.3} -> final {:.3} (best {:.3} at step {})",
            records[0].val_reward.unwrap(),
            final_val,
            best.0,
            best.1
        ),
        format!(
            "first {:.3} -> last {:.3}",
            train[0].reward_mean.unwrap(),
            train[4].reward_mean.unwrap()
        ),
        format!(
            "{} rollouts, {} samples, {:.1}k tokens",
            sum(|r| r.rollouts),
            sum(|r| r.samples),
            sum(|r| r.tokens) as f64 / 1e3
        ),
        format!(
            "system failures {}, no reward {}, plugin failures {}",
            sum(|r| r.excluded_system),
            sum(|r| r.excluded_no_reward),
            sum(|r| r.plugin_failures)
        ),
        format!(
            "retokenize {} template {} other {}",
            sum(|r| r.breaks_of(BREAK_RETOKENIZE)),
            sum(|r| r.breaks_of(BREAK_TEMPLATE)),
            sum(|r| r.breaks_of(BREAK_OTHER))
        ),
        format!(
            "{:.1}s (wait {:.1}s, train {:.1}s, drain {:.1}s)",
            mean(|r| r.step_s),
            mean(|r| r.wait_s),
            mean(|r| r.train_s),
            mean(|r| r.drain_s)
        ),
        format!(
            "mean padding waste   {:.1}%",
            100.0 * mean(|r| r.figure("padding_waste").unwrap())
        ),
    ];
    for part in expected {
        assert!(table.contains(&part), "{part:?} missing in\n{table}");
    }
    // No validation and no training yet: placeholders, not a panic.
    let empty = summary_table(&[]);
    assert!(empty.contains("baseline - -> final - (best -)"), "{empty}");
}

/// Width, height and the decoded RGB pixels of a PNG.
fn decode_png(path: &Path) -> (u32, u32, Vec<[u8; 3]>) {
    let bytes = std::fs::read(path).unwrap();
    assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n", "PNG signature");
    assert_eq!(&bytes[12..16], b"IHDR", "IHDR is the first chunk");
    let w = u32::from_be_bytes(bytes[16..20].try_into().unwrap());
    let h = u32::from_be_bytes(bytes[20..24].try_into().unwrap());
    let mut reader = png::Decoder::new(std::io::Cursor::new(bytes))
        .read_info()
        .unwrap();
    let mut buf = vec![0; reader.output_buffer_size()];
    let info = reader.next_frame(&mut buf).unwrap();
    assert_eq!((info.width, info.height), (w, h));
    assert_eq!(info.color_type, png::ColorType::Rgb);
    let pixels = buf[..info.buffer_size()]
        .chunks_exact(3)
        .map(|c| [c[0], c[1], c[2]])
        .collect();
    (w, h, pixels)
}

/// [`run_records`] with entropy measured: every panel the README promises.
fn records_with_entropy(steps: u64) -> Vec<StepRecord> {
    run_records(steps)
        .into_iter()
        .map(|mut r| {
            if !r.is_baseline() {
                r.update.set("entropy", 0.75);
            }
            r
        })
        .collect()
}

/// The RGB of each color the panels draw with (plotters' constants).
fn rgb(c: plotters::style::RGBColor) -> [u8; 3] {
    [c.0, c.1, c.2]
}

/// `training.png` decodes at the plot's size, and each panel's cell of
/// the 2-column grid holds its own series' colors on the white background,
/// while a cell no panel fills stays white.
#[test]
fn plot_draws_each_panel_in_its_own_cell() {
    let dir = tempfile::tempdir().unwrap();
    for (records, n_panels) in [(records_with_entropy(8), 6), (run_records(8), 5)] {
        let path = dir.path().join(format!("training-{n_panels}.png"));
        let labels = plot(&records, &path).unwrap();
        assert_eq!(
            labels,
            Labels::Drawn,
            "no TrueType font here: deploy/setup.sh installs fonts-dejavu-core"
        );
        let drawn = panels(&records);
        assert_eq!(drawn.len(), n_panels);
        let (w, h, pixels) = decode_png(&path);
        assert_eq!((w, h), (1200, 1000));
        let rows = n_panels.div_ceil(2) as u32;
        let cell = |i: u32| {
            let (row, col) = (i / 2, i % 2);
            let (x0, x1) = (col * w / 2, (col + 1) * w / 2);
            let (y0, y1) = (row * h / rows, (row + 1) * h / rows);
            (y0..y1)
                .flat_map(move |y| (x0..x1).map(move |x| (x, y)))
                .map(|(x, y)| pixels[(y * w + x) as usize])
                .collect::<Vec<[u8; 3]>>()
        };
        for (i, panel) in drawn.iter().enumerate() {
            let area = cell(i as u32);
            let ink = area.iter().filter(|p| **p != [255, 255, 255]).count();
            assert!(
                ink > area.len() / 100,
                "{}: {ink} of {} pixels drawn",
                panel.title,
                area.len()
            );
            for (name, _, color) in &panel.lines {
                let n = area.iter().filter(|p| **p == rgb(*color)).count();
                assert!(n > 20, "{}: the {name} series ({n} pixels)", panel.title);
            }
        }
        if n_panels % 2 == 1 {
            let empty = cell(n_panels as u32);
            assert!(
                empty.iter().all(|p| *p == [255, 255, 255]),
                "no panel, no ink"
            );
        }
    }

    // Only the baseline so far: still a valid picture.
    let early = dir.path().join("early.png");
    plot(&run_records(0), &early).unwrap();
    decode_png(&early);

    // An unwritable path is an error for the caller to log, not a panic.
    let bad = dir.path().join("missing-dir/metrics.png");
    assert!(plot(&run_records(2), &bad).is_err());
}

#[test]
fn gauges_render_the_latest_step_and_totals() {
    let gauges = TrainerGauges::new();
    let mut out = String::new();
    gauges.render(&mut out);
    assert_eq!(out, "", "nothing before the first step");

    let records = run_records(3);
    for r in &records {
        gauges.set(r);
    }
    gauges.render(&mut out);
    let value = |name: &str| -> f64 {
        let line = out
            .lines()
            .find(|l| l.split(' ').next() == Some(name))
            .unwrap_or_else(|| panic!("{name} missing in\n{out}"));
        line.rsplit(' ').next().unwrap().parse().unwrap()
    };
    let last = &records[3];
    assert_eq!(value("agl_trainer_step"), last.step as f64);
    assert_eq!(
        value("agl_trainer_weight_version"),
        last.weight_version as f64
    );
    assert_eq!(value("agl_trainer_reward_mean"), last.reward_mean.unwrap());
    // Step 3 has no validation: the gauge keeps step 2's.
    assert_eq!(
        value("agl_trainer_val_reward"),
        records[2].val_reward.unwrap()
    );
    assert_eq!(value("agl_trainer_loss"), last.figure("loss").unwrap());
    assert_eq!(value("agl_trainer_step_seconds"), last.step_s);
    assert_eq!(value("agl_trainer_drain_seconds"), last.drain_s);
    assert_eq!(value("agl_trainer_samples"), last.samples as f64);
    assert_eq!(value("agl_trainer_tokens"), last.tokens as f64);
    let total = |f: fn(&StepRecord) -> usize| records.iter().map(f).sum::<usize>() as f64;
    assert_eq!(
        value("agl_trainer_excluded_system_total"),
        total(|r| r.excluded_system)
    );
    assert_eq!(value("agl_trainer_rollouts_total"), total(|r| r.rollouts));
    assert_eq!(
        value("agl_trainer_chain_breaks_total{class=\"retokenize\"}"),
        total(|r| r.breaks_of(BREAK_RETOKENIZE))
    );
    assert!(
        !out.contains("agl_trainer_entropy"),
        "not computed, not shown"
    );
    assert!(out.contains("# TYPE agl_trainer_loss gauge\n"), "{out}");
}

#[tokio::test]
async fn gateway_metrics_include_the_trainer_gauges() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path().join("agl.db")).unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let gauges = Arc::new(TrainerGauges::new());
    let config = GatewayConfig {
        listen: addr.to_string(),
        ..GatewayConfig::default()
    };
    let gateway = Gateway::new(store, config).with_metrics_source(gauges.clone());
    tokio::spawn(gateway.serve(listener, std::future::pending()));
    let url = format!("http://{addr}/metrics");
    let scrape = || async { reqwest::get(&url).await.unwrap().text().await.unwrap() };

    let before = scrape().await;
    assert!(before.contains("agl_proxy_paused"), "{before}");
    assert!(!before.contains("agl_trainer_"), "{before}");

    let records = run_records(2);
    for r in &records {
        gauges.set(r);
    }
    let after = scrape().await;
    assert!(
        after.contains("agl_proxy_paused"),
        "gateway's own metrics kept"
    );
    assert!(after.contains("\nagl_trainer_step 2\n"), "{after}");
    assert!(
        after.contains(&format!(
            "\nagl_trainer_excluded_system_total {}\n",
            records.iter().map(|r| r.excluded_system).sum::<usize>()
        )),
        "{after}"
    );
}
