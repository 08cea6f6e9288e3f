//! Extracting and comparing answers.

use regex::Regex;
use serde_json::Value;

/// Pulls the answer out of the final text.
pub enum Extractor {
    WholeText,
    Pattern(Regex),
}

impl Extractor {
    pub fn new(pattern: Option<&str>) -> Result<Self, String> {
        match pattern {
            None => Ok(Extractor::WholeText),
            Some(p) => Regex::new(p)
                .map(Extractor::Pattern)
                .map_err(|e| format!("exact-match: invalid `pattern` {p:?}: {e}")),
        }
    }

    /// The answer in `text`: group 1 of the last match (the whole match
    /// when the pattern has no group), or the whole text; trimmed.
    pub fn extract<'t>(&self, text: &'t str) -> Option<&'t str> {
        let found = match self {
            Extractor::WholeText => Some(text),
            Extractor::Pattern(re) => re
                .captures_iter(text)
                .last()
                .and_then(|c| c.get(1).or_else(|| c.get(0)))
                .map(|m| m.as_str()),
        };
        found.map(str::trim)
    }
}

/// The expected answer: input field `field`, a string or a number.
pub fn expected_answer(input: &Value, field: &str) -> Result<String, String> {
    match input.get(field) {
        Some(Value::String(s)) => Ok(s.clone()),
        Some(Value::Number(n)) => Ok(n.to_string()),
        Some(other) => Err(format!(
            "exact-match: input field `{field}` is not a string or number: {other}"
        )),
        None => Err(format!("exact-match: the input has no `{field}` field")),
    }
}

/// Trimmed text equality (case-folded unless `case_sensitive`), or equal
/// numbers when both sides parse as numbers.
pub fn matches(answer: &str, expected: &str, case_sensitive: bool) -> bool {
    let (answer, expected) = (answer.trim(), expected.trim());
    let same_text = if case_sensitive {
        answer == expected
    } else {
        answer.to_lowercase() == expected.to_lowercase()
    };
    same_text
        || matches!((answer.parse::<f64>(), expected.parse::<f64>()), (Ok(a), Ok(b)) if a == b)
}
