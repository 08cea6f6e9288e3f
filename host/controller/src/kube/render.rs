//! Job manifests: the operator's YAML template rendered with minijinja for
//! one rollout, then the fields the runner relies on forced over whatever
//! the template said.
//!
//! Template context: `rollout_id`, `attempt`, `input` (the rollout input),
//! `env` (the injected variables), `job_name`, `namespace`, `image` (the
//! configured default image) and `timeout_secs`. The `yaml` filter turns any
//! value into a double-quoted YAML scalar, so rollout input cannot inject
//! YAML structure: `value: {{ input.task | yaml }}`.

use std::collections::BTreeMap;

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::EnvVar;
use minijinja::value::Serde;
use minijinja::{Environment, Value};

use super::names::{job_name, label_value};
use super::{JobSpec, KubeConfig, KubeError};

pub const LABEL_ROLLOUT: &str = "agl.dev/rollout-id";
pub const LABEL_ATTEMPT: &str = "agl.dev/attempt";
pub const LABEL_MANAGED: &str = "agl.dev/managed-by";
/// The raw rollout id; the label may be a sanitized stand-in.
pub const ANNOTATION_ROLLOUT: &str = "agl.dev/rollout-id";
/// The selector every list and watch of the runner uses.
pub const MANAGED_SELECTOR: &str = "agl.dev/managed-by=agl";

const TEMPLATE_NAME: &str = "job";

/// A compiled Job template.
pub struct JobTemplate {
    env: Environment<'static>,
}

impl JobTemplate {
    /// Compiles `source`; syntax errors surface here, not at first launch.
    pub fn new(source: &str) -> Result<Self, KubeError> {
        let mut env = Environment::new();
        env.set_undefined_behavior(minijinja::UndefinedBehavior::Strict);
        env.add_filter("yaml", yaml_scalar);
        env.add_template_owned(TEMPLATE_NAME, source.to_string())
            .map_err(|e| KubeError::Template(e.to_string()))?;
        Ok(JobTemplate { env })
    }

    /// Reads and compiles the template `config.job_template` names.
    pub fn of_config(config: &KubeConfig) -> Result<Self, KubeError> {
        let path = config
            .job_template
            .clone()
            .ok_or_else(|| KubeError::Config("controller.kube.job_template is not set".into()))?;
        let source = std::fs::read_to_string(&path)
            .map_err(|source| KubeError::ReadTemplate { path, source })?;
        Self::new(&source)
    }

    /// Renders the manifest for one attempt and forces the runner's fields.
    pub fn render(&self, spec: &JobSpec, config: &KubeConfig) -> Result<Job, KubeError> {
        let name = job_name(&spec.rollout_id, spec.attempt);
        let context = minijinja::context! {
            rollout_id => &spec.rollout_id,
            attempt => spec.attempt,
            input => Value::from(Serde(&spec.input)),
            env => Value::from(Serde(&spec.env)),
            job_name => &name,
            namespace => &config.namespace,
            image => &config.image,
            timeout_secs => spec.timeout_secs,
        };
        let text = self
            .env
            .get_template(TEMPLATE_NAME)
            .and_then(|t| t.render(context))
            .map_err(|e| KubeError::Template(e.to_string()))?;
        let manifest = parse_single_job(&text)?;
        let mut job: Job =
            serde_json::from_value(manifest).map_err(|e| KubeError::InvalidJob(e.to_string()))?;
        force(&mut job, spec, config, name)?;
        Ok(job)
    }
}

/// The `yaml` filter: strings become JSON-quoted strings (a subset of YAML's
/// double-quoted style), other values their JSON text, quoted the same way.
/// Control and line-separator characters are `\u`-escaped because YAML
/// rejects some of them even inside quotes.
fn yaml_scalar(value: Value) -> Result<String, minijinja::Error> {
    if value.is_undefined() {
        return Err(minijinja::Error::new(
            minijinja::ErrorKind::UndefinedError,
            "`yaml` got an undefined value",
        ));
    }
    let text = match value.as_str() {
        Some(s) => s.to_string(),
        None => serde_json::to_string(&value).map_err(|e| {
            minijinja::Error::new(minijinja::ErrorKind::InvalidOperation, e.to_string())
        })?,
    };
    let mut out = String::with_capacity(text.len() + 2);
    out.push('"');
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            c if c.is_control() || matches!(c, '\u{2028}' | '\u{2029}' | '\u{feff}') => {
                out.push_str(&format!("\\u{:04x}", u32::from(c)));
            }
            c => out.push(c),
        }
    }
    out.push('"');
    Ok(out)
}

/// Exactly one YAML document of `kind: Job`, `apiVersion: batch/v1`.
fn parse_single_job(text: &str) -> Result<serde_json::Value, KubeError> {
    let docs: Vec<serde_json::Value> =
        serde_saphyr::from_str_multiple::<serde_json::Value, _>(text)
            .map_err(|e| KubeError::InvalidJob(format!("rendered template is not YAML: {e}")))?;
    let [doc] = <[_; 1]>::try_from(docs).map_err(|docs| {
        KubeError::InvalidJob(format!("expected one YAML document, got {}", docs.len()))
    })?;
    let kind = (doc.get("apiVersion"), doc.get("kind"));
    if kind.0.and_then(|v| v.as_str()) != Some("batch/v1")
        || kind.1.and_then(|v| v.as_str()) != Some("Job")
    {
        return Err(KubeError::InvalidJob(
            "the template must render apiVersion: batch/v1, kind: Job".into(),
        ));
    }
    Ok(doc)
}

/// Overwrites what the runner depends on: identity, labels, one try, the
/// deadline, garbage collection and the injected environment.
fn force(
    job: &mut Job,
    spec: &JobSpec,
    config: &KubeConfig,
    name: String,
) -> Result<(), KubeError> {
    let labels = BTreeMap::from([
        (LABEL_ROLLOUT.to_string(), label_value(&spec.rollout_id)),
        (LABEL_ATTEMPT.to_string(), spec.attempt.to_string()),
        (LABEL_MANAGED.to_string(), "agl".to_string()),
    ]);
    let annotations = BTreeMap::from([(ANNOTATION_ROLLOUT.to_string(), spec.rollout_id.clone())]);

    job.metadata.name = Some(name);
    job.metadata.generate_name = None;
    job.metadata.namespace = Some(config.namespace.clone());
    job.metadata
        .labels
        .get_or_insert_default()
        .extend(labels.clone());
    job.metadata
        .annotations
        .get_or_insert_default()
        .extend(annotations.clone());

    let job_spec = job
        .spec
        .as_mut()
        .ok_or_else(|| KubeError::InvalidJob("the Job has no spec".into()))?;
    job_spec.backoff_limit = Some(0);
    job_spec.active_deadline_seconds = Some(i64::try_from(spec.timeout_secs).unwrap_or(i64::MAX));
    job_spec.ttl_seconds_after_finished = Some(config.ttl_seconds_after_finished);

    let template = &mut job_spec.template;
    let meta = template.metadata.get_or_insert_default();
    meta.labels.get_or_insert_default().extend(labels);
    meta.annotations.get_or_insert_default().extend(annotations);
    let pod = template
        .spec
        .as_mut()
        .ok_or_else(|| KubeError::InvalidJob("the Job's pod template has no spec".into()))?;
    pod.restart_policy = Some("Never".into());
    // Init containers keep their own environment: they prepare, the agent runs.
    for container in &mut pod.containers {
        let env = container.env.get_or_insert_default();
        env.retain(|var| !spec.env.contains_key(&var.name));
        env.extend(spec.env.iter().map(|(name, value)| EnvVar {
            name: name.clone(),
            value: Some(value.clone()),
            value_from: None,
        }));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn quote(value: serde_json::Value) -> String {
        yaml_scalar(Value::from(Serde(&value))).unwrap()
    }

    #[test]
    fn yaml_filter_quotes_so_yaml_reads_back_the_same_string() {
        let hostile = [
            "plain",
            "a: b",
            "x\"\nkind: Pod\n  - evil",
            "# not a comment",
            "{a: [1, 2]}",
            "back\\slash\ttab\r\u{7f}\u{85}\u{2028}\u{feff}end",
            "- item",
            "&anchor *ref !!tag %directive @ `",
            "yes",
            "\u{1F600} ünïcode",
        ];
        for raw in hostile {
            let scalar = quote(raw.into());
            assert!(!scalar.contains('\n'), "{scalar}");
            let yaml = format!("key: {scalar}\nother: 1\n");
            let back: BTreeMap<String, serde_json::Value> = serde_saphyr::from_str(&yaml).unwrap();
            assert_eq!(back["key"], raw, "{yaml}");
            assert_eq!(back.len(), 2);
        }
    }

    #[test]
    fn yaml_filter_turns_other_values_into_their_json_text() {
        let value = serde_json::json!({"n": 3, "s": "q\""});
        let yaml = format!("v: {}", quote(value.clone()));
        let back: BTreeMap<String, String> = serde_saphyr::from_str(&yaml).unwrap();
        assert_eq!(back["v"], value.to_string());
        assert_eq!(quote(serde_json::json!(7)), "\"7\"");
        assert!(yaml_scalar(Value::UNDEFINED).is_err());
    }

    #[test]
    fn templates_must_render_exactly_one_batch_job() {
        let spec = JobSpec {
            rollout_id: "r".into(),
            attempt: 0,
            input: serde_json::json!({}),
            env: BTreeMap::new(),
            timeout_secs: 60,
        };
        let config = KubeConfig::default();
        let render = |source: &str| JobTemplate::new(source).and_then(|t| t.render(&spec, &config));
        let job = "apiVersion: batch/v1\nkind: Job\nspec:\n  template:\n    spec:\n      containers: []\n";
        assert!(render(job).is_ok());
        assert!(matches!(
            render("apiVersion: v1\nkind: Pod\n"),
            Err(KubeError::InvalidJob(_))
        ));
        let two = format!("{job}---\n{job}");
        assert!(matches!(render(&two), Err(KubeError::InvalidJob(_))));
        assert!(matches!(
            render("{{ input.missing | yaml }}"),
            Err(KubeError::Template(_))
        ));
        assert!(matches!(
            JobTemplate::new("{% if %}"),
            Err(KubeError::Template(_))
        ));
    }
}
