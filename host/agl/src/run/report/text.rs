//! The text a user reads: two lines per step and a table at the end.

use std::collections::BTreeMap;
use std::fmt::Write;

use super::StepRecord;
use super::record::{BREAK_OTHER, BREAK_RETOKENIZE, BREAK_TEMPLATE};
use super::table::{Format, METRICS};

/// Samples per rollout, the figure token-exact continuation drives to 1.00.
pub fn per_rollout(samples: usize, rollouts: usize) -> String {
    match rollouts {
        0 => "-".into(),
        n => format!("{:.2}", samples as f64 / n as f64),
    }
}

/// Two lines per step: what happened, then how (fields always in the same
/// order), e.g.
/// `step 3/8 v3 | reward 0.625 | val 0.950 tool 100% | tool 84% | 1.84 calls 1.00 samples
/// per rollout | breaks retok 0 tmpl 0 other 0 | 32 rollouts 4.3k tok | 38.2s`
/// `    wait 20.1s train 17.5s drain 0.4s | 24 trained (8 zero-advantage skipped) | grad 3.61
/// ent 1.52 engine kl 3.2e-5 gap 1.1e-3 max gap 4.0e-2 outside 0% outside seqs 0% corrected 0%
/// | excl sys 1 noreward 0` (gap: mean and max |log p_engine - log p_trainer|; outside:
/// tokens and sequences whose ratio leaves the correction's bounds). The update's figures
/// are the rows of [`METRICS`] with a column, in table order.
/// `val` appears on validation steps only; the tool-use rates once `tools`
/// (the harness has reported using a tool in this run); plugin failures,
/// stale drops and carried groups only when non-zero. Step 0 is the one
/// baseline line. (The loss is in `metrics.jsonl` but not here: with one
/// optimizer step per batch it is ~0 by construction.)
pub fn summary_lines(r: &StepRecord, tools: bool) -> String {
    let val = |s: &mut String| {
        if let Some(v) = r.val_reward {
            let _ = write!(s, " | val {v:.3}");
            if let Some(t) = r.val_tool_use.filter(|_| tools) {
                let _ = write!(s, " tool {}", percent(t));
            }
        }
    };
    if r.is_baseline() {
        let mut s = format!("baseline v{}", r.weight_version);
        val(&mut s);
        let _ = write!(
            s,
            " ({} rollouts, {} calls/rollout) | {:.1}s",
            r.val_rollouts,
            opt(r.val_calls_per_rollout, 2),
            r.elapsed_s
        );
        return s;
    }
    let mut s = format!(
        "step {}/{} v{} | reward {}",
        r.step,
        r.total_steps,
        r.weight_version,
        opt(r.reward_mean, 3)
    );
    val(&mut s);
    if let Some(t) = r.tool_use.filter(|_| tools) {
        let _ = write!(s, " | tool {}", percent(t));
    }
    let _ = write!(
        s,
        " | {} calls {} samples per rollout | breaks {} | {} rollouts {} tok",
        opt(r.calls_per_rollout, 2),
        per_rollout(r.samples, r.rollouts),
        breaks(
            &r.breaks,
            &[("retok", BREAK_RETOKENIZE), ("tmpl", BREAK_TEMPLATE)]
        ),
        r.rollouts,
        si(r.tokens as f64),
    );
    for (label, n) in [
        ("plugin failures", r.plugin_failures),
        ("stale dropped", r.dropped_stale),
        ("stale tokens masked", r.stale_tokens),
        ("carried groups", r.carried_groups),
    ] {
        if n > 0 {
            let _ = write!(s, " | {label} {n}");
        }
    }
    let _ = write!(
        s,
        " | {:.1}s\n    wait {:.1}s train {:.1}s drain {:.1}s | {} trained ({} zero-advantage skipped) \
         | {} | excl sys {} noreward {}",
        r.step_s,
        r.wait_s,
        r.train_s,
        r.drain_s,
        r.samples - r.skipped_samples.min(r.samples),
        r.skipped_samples,
        columns(r),
        r.excluded_system,
        r.excluded_no_reward,
    );
    s
}

/// The update's figures, each row of [`METRICS`] with a column: `grad 3.61
/// ent 1.52 engine kl 3.2e-5 ...`, `-` for one not computed.
fn columns(r: &StepRecord) -> String {
    let cells: Vec<String> = METRICS
        .iter()
        .filter_map(|m| {
            let (label, format) = m.column?;
            let v = m.value(r).filter(|v| v.is_finite());
            let shown = match format {
                Format::Fixed(decimals) => opt(v, decimals),
                Format::Sci => sci(v),
                Format::Percent => v.map_or("-".into(), percent),
            };
            Some(format!("{label} {shown}"))
        })
        .collect();
    cells.join(" ")
}

/// `3.2e-5`, `-` when absent.
fn sci(v: Option<f64>) -> String {
    v.filter(|v| v.is_finite())
        .map_or("-".into(), |v| format!("{v:.1e}"))
}

/// `84%`, `0.4%`.
fn percent(x: f64) -> String {
    let p = 100.0 * x;
    if p != 0.0 && p.abs() < 10.0 {
        format!("{p:.1}%")
    } else {
        format!("{p:.0}%")
    }
}

/// The end-of-run table, computed from all records of the run (including
/// those logged before a resume).
pub fn summary_table(records: &[StepRecord]) -> String {
    let train: Vec<&StepRecord> = records.iter().filter(|r| !r.is_baseline()).collect();
    let baseline = records
        .iter()
        .find(|r| r.is_baseline())
        .and_then(|r| r.val_reward);
    let final_val = train.iter().rev().find_map(|r| r.val_reward);
    let best_val = records
        .iter()
        .filter_map(|r| r.val_reward.map(|v| (v, r.step)))
        .filter(|(v, _)| v.is_finite())
        // The first step that reached the best value.
        .max_by(|a, b| a.0.total_cmp(&b.0).then(b.1.cmp(&a.1)));
    let rewards: Vec<f64> = train.iter().filter_map(|r| r.reward_mean).collect();
    let total = |f: fn(&StepRecord) -> usize| train.iter().map(|r| f(r)).sum::<usize>();
    let mut all_breaks: BTreeMap<String, usize> = BTreeMap::new();
    for r in &train {
        for (class, n) in &r.breaks {
            *all_breaks.entry(class.clone()).or_default() += n;
        }
    }
    let wall = records.iter().map(|r| r.elapsed_s).fold(0.0, f64::max);
    let last = train.last();

    let mut t = String::from("run summary\n");
    let mut row = |name: &str, value: String| {
        let _ = writeln!(t, "  {name:<20} {value}");
    };
    row(
        "steps",
        format!(
            "{} of {} (weight version {})",
            train.len(),
            last.map_or(0, |r| r.total_steps),
            last.map_or(0, |r| r.weight_version)
        ),
    );
    row("wall time", duration(wall));
    row(
        "val reward",
        format!(
            "baseline {} -> final {} (best {})",
            opt(baseline, 3),
            opt(final_val, 3),
            best_val.map_or("-".into(), |(v, step)| format!("{v:.3} at step {step}"))
        ),
    );
    row(
        "train reward",
        format!(
            "first {} -> last {}",
            opt(rewards.first().copied(), 3),
            opt(rewards.last().copied(), 3)
        ),
    );
    let calls: Vec<f64> = train.iter().filter_map(|r| r.calls_per_rollout).collect();
    row(
        "calls per rollout",
        format!(
            "first {} -> last {} (samples per rollout {})",
            opt(calls.first().copied(), 2),
            opt(calls.last().copied(), 2),
            per_rollout(total(|r| r.samples), total(|r| r.rollouts))
        ),
    );
    let used = |t: Option<f64>| t.is_some_and(|t| t > 0.0);
    if records
        .iter()
        .any(|r| used(r.tool_use) || used(r.val_tool_use))
    {
        let tool: Vec<f64> = train.iter().filter_map(|r| r.tool_use).collect();
        let pct = |t: Option<&f64>| t.map_or("-".into(), |t| percent(*t));
        row(
            "tool use",
            format!(
                "train first {} -> last {}, val baseline {} -> final {}",
                pct(tool.first()),
                pct(tool.last()),
                pct(records
                    .iter()
                    .find(|r| r.is_baseline())
                    .and_then(|r| r.val_tool_use.as_ref())),
                pct(train.iter().rev().find_map(|r| r.val_tool_use.as_ref()))
            ),
        );
    }
    row(
        "trained on",
        format!(
            "{} rollouts, {} samples, {} tokens",
            total(|r| r.rollouts),
            total(|r| r.samples),
            si(total(|r| r.tokens) as f64)
        ),
    );
    row(
        "excluded",
        format!(
            "system failures {}, no reward {}, plugin failures {}, stale {}",
            total(|r| r.excluded_system),
            total(|r| r.excluded_no_reward),
            total(|r| r.plugin_failures),
            total(|r| r.dropped_stale)
        ),
    );
    row(
        "chain breaks",
        breaks(
            &all_breaks,
            &[
                ("retokenize", BREAK_RETOKENIZE),
                ("template", BREAK_TEMPLATE),
            ],
        ),
    );
    let avg = |f: fn(&StepRecord) -> f64| mean(train.iter().map(|r| f(r)));
    row(
        "mean step time",
        format!(
            "{}s (wait {}s, train {}s, drain {}s)",
            opt(avg(|r| r.step_s), 1),
            opt(avg(|r| r.wait_s), 1),
            opt(avg(|r| r.train_s), 1),
            opt(avg(|r| r.drain_s), 1)
        ),
    );
    let waste = mean(train.iter().filter_map(|r| r.figure("padding_waste")));
    row(
        "mean padding waste",
        waste.map_or("-".into(), |w| format!("{:.1}%", 100.0 * w)),
    );
    t
}

/// `retok 1 tmpl 0 other 2`: the named classes always (in `named` order),
/// then any other class by its own name, `other` last.
fn breaks(counts: &BTreeMap<String, usize>, named: &[(&str, &str)]) -> String {
    let mut parts: Vec<String> = named
        .iter()
        .map(|(label, class)| format!("{label} {}", counts.get(*class).unwrap_or(&0)))
        .collect();
    for (class, n) in counts {
        if class != BREAK_OTHER && !named.iter().any(|(_, c)| c == class) {
            parts.push(format!("{class} {n}"));
        }
    }
    parts.push(format!("other {}", counts.get(BREAK_OTHER).unwrap_or(&0)));
    parts.join(" ")
}

/// Mean of the finite values, `None` when there are none.
fn mean(values: impl Iterator<Item = f64>) -> Option<f64> {
    let (sum, n) = values
        .filter(|v| v.is_finite())
        .fold((0.0, 0usize), |(s, n), v| (s + v, n + 1));
    (n > 0).then(|| sum / n as f64)
}

fn opt(v: Option<f64>, decimals: usize) -> String {
    match v {
        Some(v) if v.is_finite() => format!("{v:.decimals$}"),
        _ => "-".into(),
    }
}

/// `950`, `3.1k`, `1.2M`.
fn si(n: f64) -> String {
    match n {
        n if n >= 1e6 => format!("{:.1}M", n / 1e6),
        n if n >= 1e3 => format!("{:.1}k", n / 1e3),
        n => format!("{n:.0}"),
    }
}

/// `42.0s`, `12m 05s`, `3h 02m`.
pub(super) fn duration(secs: f64) -> String {
    let whole = secs.max(0.0).round() as u64;
    match whole {
        s if s < 60 => format!("{secs:.1}s"),
        s if s < 3600 => format!("{}m {:02}s", s / 60, s % 60),
        s => format!("{}h {:02}m", s / 3600, s % 3600 / 60),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn units() {
        assert_eq!(si(950.0), "950");
        assert_eq!(si(3_100.0), "3.1k");
        assert_eq!(si(1_250_000.0), "1.2M");
        assert_eq!(duration(42.04), "42.0s");
        assert_eq!(duration(725.0), "12m 05s");
        assert_eq!(duration(3.0 * 3600.0 + 125.0), "3h 02m");
        assert_eq!(mean([1.0, f64::NAN, 3.0].into_iter()), Some(2.0));
        assert_eq!(mean(std::iter::empty()), None);
    }

    #[test]
    fn unknown_break_classes_are_shown_by_name() {
        let counts = BTreeMap::from([("other".to_string(), 2), ("weird".to_string(), 5)]);
        assert_eq!(
            breaks(&counts, &[("retok", BREAK_RETOKENIZE)]),
            "retok 0 weird 5 other 2"
        );
    }
}
