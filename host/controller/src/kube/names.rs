//! Kubernetes-safe names and label values derived from rollout ids.
//!
//! Rollout ids are free text; Kubernetes names are not. Both derivations are
//! deterministic (a restarted controller finds its Jobs again) and injective
//! in practice: whenever the id had to be changed to fit, a hash of the raw id
//! is appended so two ids that sanitize alike still get different names.

/// Longest Job name we produce: Kubernetes copies it into the pods'
/// `job-name` label, whose values are limited to 63 characters.
const MAX_NAME: usize = 63;
/// Longest label value Kubernetes accepts.
const MAX_LABEL: usize = 63;
/// Hex digits of the raw-id hash appended when an id had to be changed.
const HASH_LEN: usize = 10;

/// The Job name for one attempt of a rollout: `agl-{id}-{attempt}` when the
/// id is already a lowercase DNS-1123 label fragment and the result fits in
/// 63 characters, else the sanitized, truncated id plus a hash of the raw id.
pub fn job_name(rollout_id: &str, attempt: u32) -> String {
    let plain = format!("agl-{rollout_id}-{attempt}");
    let sanitized: String = rollout_id
        .chars()
        .map(|c| c.to_ascii_lowercase())
        .map(|c| keep_or_dash(c, |c| c.is_ascii_lowercase() || c.is_ascii_digit()))
        .collect();
    if sanitized == rollout_id && plain.len() <= MAX_NAME {
        return plain;
    }
    let suffix = format!("-{attempt}-{}", hash(rollout_id));
    let room = MAX_NAME - "agl-".len() - suffix.len();
    let head = truncate(&sanitized, room);
    format!("agl-{head}{suffix}")
}

/// A label value standing for the rollout id: the id itself when it is a
/// valid label value, else the sanitized, truncated id plus a hash. The raw
/// id always travels in an annotation as well.
pub fn label_value(rollout_id: &str) -> String {
    let sanitized: String = rollout_id
        .chars()
        .map(|c| {
            keep_or_dash(c, |c| {
                c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.')
            })
        })
        .collect();
    let valid_ends = rollout_id.starts_with(|c: char| c.is_ascii_alphanumeric())
        && rollout_id.ends_with(|c: char| c.is_ascii_alphanumeric());
    if sanitized == rollout_id && valid_ends && rollout_id.len() <= MAX_LABEL {
        return sanitized;
    }
    let suffix = hash(rollout_id);
    let room = MAX_LABEL - suffix.len() - 1;
    let head = truncate(&sanitized, room);
    if head.is_empty() {
        suffix
    } else {
        format!("{head}-{suffix}")
    }
}

fn keep_or_dash(c: char, keep: impl Fn(char) -> bool) -> char {
    if keep(c) { c } else { '-' }
}

/// Cuts to at most `max` bytes (the input is ASCII) and strips separators at
/// both ends so the name's parts join into a valid name.
fn truncate(s: &str, max: usize) -> String {
    let cut = &s[..s.len().min(max)];
    cut.trim_matches(|c: char| !c.is_ascii_alphanumeric())
        .to_string()
}

fn hash(raw: &str) -> String {
    blake3::hash(raw.as_bytes()).to_hex()[..HASH_LEN].to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn is_dns_label(s: &str) -> bool {
        s.len() <= 63
            && s.starts_with(|c: char| c.is_ascii_lowercase() || c.is_ascii_digit())
            && s.ends_with(|c: char| c.is_ascii_lowercase() || c.is_ascii_digit())
            && s.chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
    }

    fn is_label_value(s: &str) -> bool {
        s.len() <= 63
            && s.starts_with(|c: char| c.is_ascii_alphanumeric())
            && s.ends_with(|c: char| c.is_ascii_alphanumeric())
            && s.chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
    }

    #[test]
    fn plain_ids_keep_their_readable_name() {
        assert_eq!(job_name("r-0001", 2), "agl-r-0001-2");
        assert_eq!(label_value("R_0001.a"), "R_0001.a");
    }

    #[test]
    fn awkward_ids_are_sanitized_and_hashed_apart() {
        let ids = [
            "Task/42",
            "task-42",
            "TASK-42",
            "task 42",
            "x".repeat(200).as_str().to_owned().leak(),
        ];
        let mut names = Vec::new();
        for id in ids {
            let name = job_name(id, 0);
            assert!(is_dns_label(&name), "{name:?}");
            assert_eq!(name, job_name(id, 0), "deterministic");
            let label = label_value(id);
            assert!(is_label_value(&label), "{label:?}");
            names.push(name);
        }
        names.sort();
        names.dedup();
        assert_eq!(names.len(), ids.len(), "distinct ids give distinct names");
        assert_ne!(job_name("Task/42", 0), job_name("Task/42", 1));
    }

    #[test]
    fn long_ids_are_cut_to_63_with_a_hash() {
        let id = "a".repeat(100);
        let name = job_name(&id, 12);
        assert_eq!(name.len(), 63);
        assert!(name.ends_with(&format!("-12-{}", hash(&id))));
        assert_eq!(label_value(&id).len(), 63);
        assert!(is_label_value(&label_value("--")));
        assert!(is_dns_label(&job_name("--", 0)));
    }
}
