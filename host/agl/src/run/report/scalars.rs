//! A [`StepRecord`] as the flat scalars the exports log per step
//! (TensorBoard, W&B): every figure of [`METRICS`] under its tag
//! (`train/reward`, `val/reward`, `time/train_s`, ...) and each break class
//! under `breaks/CLASS`, the step itself being the x axis.

use std::collections::BTreeMap;

use super::record::{BREAK_OTHER, BREAK_RETOKENIZE, BREAK_TEMPLATE, StepRecord};
use super::table::METRICS;

/// The tags of a step, by name. A figure that was not computed (`None`,
/// non-finite) has no tag that step. The baseline (step 0) has only what it
/// measured: the validation figures, `time/elapsed_s` and the run's shape.
pub fn scalars(r: &StepRecord) -> BTreeMap<String, f64> {
    let mut out = BTreeMap::new();
    let mut put = |tag: String, v: f64| {
        if v.is_finite() {
            out.insert(tag, v);
        }
    };
    for m in METRICS.iter().filter(|m| m.baseline || !r.is_baseline()) {
        if let (Some(tag), Some(v)) = (m.tag, m.value(r)) {
            put(tag.to_string(), v);
        }
    }
    if !r.is_baseline() {
        // The three classes always (a chart per class from the first
        // step), any other class the adapter reported as well.
        for class in [BREAK_RETOKENIZE, BREAK_TEMPLATE, BREAK_OTHER] {
            put(format!("breaks/{class}"), r.breaks_of(class) as f64);
        }
        for (class, n) in &r.breaks {
            put(format!("breaks/{class}"), *n as f64);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A training record whose every numeric field (and break class) holds
    /// a value of its own, built through JSON so a field added to
    /// `StepRecord` later is filled too, as is each update statistic.
    fn distinct_record() -> (StepRecord, Vec<(String, f64)>) {
        let mut json = serde_json::to_value(StepRecord::default()).unwrap();
        let obj = json.as_object_mut().unwrap();
        for m in METRICS {
            if let super::super::table::Value::Update { key, .. } = m.value {
                obj.insert(key.into(), serde_json::Value::Null);
            }
        }
        let mut fields = Vec::new();
        let mut next = 1.0;
        let keys: Vec<String> = obj.keys().cloned().collect();
        for key in keys {
            let value = &obj[&key];
            let numeric =
                value.is_number() || (value.is_null() && key != "plugins" && key != "breaks");
            if key == "step" || !numeric {
                continue;
            }
            // Integer fields get integers; f64 ones a fraction.
            let (v, json) = match value.is_u64() {
                true => (next, serde_json::json!(next as u64)),
                false => (next + 0.5, serde_json::json!(next + 0.5)),
            };
            obj.insert(key.clone(), json);
            fields.push((key, v));
            next += 1.0;
        }
        obj.insert("step".into(), serde_json::json!(3));
        obj.insert(
            "breaks".into(),
            serde_json::json!({"retokenize": 101, "template": 102, "other": 103, "mystery": 104}),
        );
        for (class, v) in [
            ("retokenize", 101.0),
            ("template", 102.0),
            ("other", 103.0),
            ("mystery", 104.0),
        ] {
            fields.push((format!("breaks.{class}"), v));
        }
        (serde_json::from_value(json).unwrap(), fields)
    }

    #[test]
    fn every_numeric_field_of_a_training_step_has_a_tag() {
        let (record, fields) = distinct_record();
        let tags = scalars(&record);
        for (field, v) in &fields {
            assert!(
                tags.values().any(|x| x == v),
                "field {field} ({v}) has no tag: {tags:?}"
            );
        }
        // Each value once (no field under two tags), plus the one derived tag.
        assert_eq!(tags.len(), fields.len() + 1, "{tags:?}");
    }

    #[test]
    fn tags_are_stable_names_of_their_fields() {
        let (r, _) = distinct_record();
        let tags = scalars(&r);
        let expect = [
            ("train/reward", r.reward_mean.unwrap()),
            ("val/reward", r.val_reward.unwrap()),
            ("val/rollouts", r.val_rollouts as f64),
            ("train/calls_per_rollout", r.calls_per_rollout.unwrap()),
            ("train/samples", r.samples as f64),
            (
                "train/samples_per_rollout",
                r.samples as f64 / r.rollouts as f64,
            ),
            ("breaks/retokenize", 101.0),
            ("breaks/template", 102.0),
            ("breaks/other", 103.0),
            ("breaks/mystery", 104.0),
            ("update/mismatch_mean", r.figure("mismatch_mean").unwrap()),
            ("update/engine_kl", r.figure("engine_kl").unwrap()),
            ("update/grad_norm", r.figure("grad_norm").unwrap()),
            ("update/entropy", r.figure("entropy").unwrap()),
            ("time/wait_s", r.wait_s),
            ("time/train_s", r.train_s),
            ("time/drain_s", r.drain_s),
            ("time/step_s", r.step_s),
            ("run/weight_version", r.weight_version as f64),
        ];
        for (tag, v) in expect {
            assert_eq!(tags.get(tag), Some(&v), "{tag}");
        }
    }

    #[test]
    fn missing_figures_have_no_tag_and_the_baseline_only_its_own() {
        let mut record = StepRecord {
            step: 1,
            rollouts: 4,
            samples: 6,
            step_s: f64::NAN,
            ..StepRecord::default()
        };
        record.update.set("loss", 0.5);
        let tags = scalars(&record);
        assert_eq!(tags["update/loss"], 0.5);
        assert_eq!(tags["breaks/template"], 0.0, "a class with no break is 0");
        for absent in [
            "update/entropy",
            "train/reward",
            "val/reward",
            "val/rollouts",
            "time/step_s",
        ] {
            assert!(!tags.contains_key(absent), "{absent}: {tags:?}");
        }

        let baseline = StepRecord {
            val_tool_use: Some(0.5),
            ..StepRecord::baseline(20, 4.5, Some(0.25), 16)
        };
        let tags = scalars(&baseline);
        let keys: Vec<&str> = tags.keys().map(String::as_str).collect();
        assert_eq!(
            keys,
            [
                "run/total_steps",
                "run/weight_version",
                "time/elapsed_s",
                "val/reward",
                "val/rollouts",
                "val/tool_use",
            ]
        );
        assert_eq!((tags["val/reward"], tags["val/rollouts"]), (0.25, 16.0));
    }
}
