//! The URLs agl hands out and takes in, built in one place: an agent's
//! proxy base URL and events URL, and engine base URLs in one normal form.
//!
//! A rollout's proxy base URL is
//! `{gateway}/proxy/{rollout_id}/{attempt}/{train|val}/openai/v1`; the
//! gateway returns it (and the events URL) with every rollout, so no client
//! has to build or take apart one.

use serde::Deserialize;
use utoipa::IntoParams;

use crate::rollout::Mode;

/// Longest rollout id agl accepts.
pub const MAX_ROLLOUT_ID_LEN: usize = 128;

/// [`check_rollout_id`] as a regular expression (the OpenAPI `pattern` of
/// rollout ids), less its one exception: `.` and `..` match it, and are
/// refused.
pub const ROLLOUT_ID_PATTERN: &str = "^[A-Za-z0-9._-]{1,128}$";

/// A rollout id is one URL path segment that every client, proxy and
/// router reads the same way: 1..=128 of `A-Z a-z 0-9 . _ -`, and not `.`
/// or `..` (which URL clients resolve away).
pub fn check_rollout_id(id: &str) -> Result<(), String> {
    let allowed = |b: u8| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-');
    if id.is_empty()
        || id.len() > MAX_ROLLOUT_ID_LEN
        || !id.bytes().all(allowed)
        || id == "."
        || id == ".."
    {
        return Err(format!(
            "`{}` is not 1..={MAX_ROLLOUT_ID_LEN} of A-Z a-z 0-9 . _ - (and not `.` or `..`)",
            id.escape_debug()
        ));
    }
    Ok(())
}

/// Percent-encodes one path segment or query value (RFC 3986 unreserved
/// characters stay as they are).
pub fn encode_segment(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                out.push(b as char)
            }
            _ => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
}

/// The OpenAI-style base URL of rollout `id`'s attempt on gateway `base`
/// (no trailing `/`).
pub fn proxy_base_url(base: &str, id: &str, attempt: u32, mode: Mode) -> String {
    format!(
        "{}/proxy/{}/{attempt}/{}/openai/v1",
        base.trim_end_matches('/'),
        encode_segment(id),
        mode.as_str()
    )
}

/// The Anthropic-style base URL of rollout `id`'s attempt on gateway
/// `base` (SDKs append `/v1/messages`; no trailing `/`).
pub fn anthropic_base_url(base: &str, id: &str, attempt: u32, mode: Mode) -> String {
    format!(
        "{}/proxy/{}/{attempt}/{}/anthropic",
        base.trim_end_matches('/'),
        encode_segment(id),
        mode.as_str()
    )
}

/// The parameters of a proxy route,
/// `/proxy/{rollout_id}/{attempt}/{mode}/...`: the path of a
/// [`proxy_base_url`] or [`anthropic_base_url`].
#[derive(Debug, Clone, Deserialize, IntoParams)]
#[into_params(parameter_in = Path)]
pub struct ProxyPath {
    /// The rollout (as in its `proxy_base_url`).
    #[param(pattern = "^[A-Za-z0-9._-]{1,128}$")]
    pub rollout_id: String,
    /// Its current attempt.
    pub attempt: u32,
    /// The rollout's mode (another is a 404).
    #[param(value_type = Mode)]
    pub mode: String,
}

/// Where rollout `id`'s agent posts its events on gateway `base`.
pub fn events_url(base: &str, id: &str) -> String {
    format!(
        "{}/v1/rollouts/{}/events",
        base.trim_end_matches('/'),
        encode_segment(id)
    )
}

/// An OpenAI-compatible engine's base URL in agl's one form: the URL calls
/// are made under, ending in `/v1` (`http://host:8000/v1`). Either the
/// server root (`http://host:8000`) or the `/v1` URL is accepted; a
/// trailing `/` is dropped. Non-HTTP schemes (`embedded://NAME`) are kept.
pub fn engine_base_url(url: &str) -> String {
    let url = url.trim_end_matches('/');
    if !(url.starts_with("http://") || url.starts_with("https://")) || url.ends_with("/v1") {
        return url.to_string();
    }
    format!("{url}/v1")
}

/// The server root of an engine base URL (`/v1` dropped): where vLLM's and
/// SGLang's admin routes (`/update_weights_from_disk`, ...) live.
pub fn engine_root_url(url: &str) -> String {
    let url = url.trim_end_matches('/');
    url.strip_suffix("/v1").unwrap_or(url).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn engine_urls_have_one_form() {
        for given in [
            "http://h:8000",
            "http://h:8000/",
            "http://h:8000/v1",
            "http://h:8000/v1/",
        ] {
            assert_eq!(engine_base_url(given), "http://h:8000/v1", "{given}");
            assert_eq!(engine_root_url(given), "http://h:8000", "{given}");
        }
        assert_eq!(engine_base_url("embedded://policy"), "embedded://policy");
    }

    #[test]
    fn the_openapi_descriptions_carry_the_rollout_id_pattern() {
        use utoipa::{IntoParams, PartialSchema};
        let new = serde_json::to_value(crate::api::NewRollout::schema()).unwrap();
        assert_eq!(new["properties"]["id"]["pattern"], ROLLOUT_ID_PATTERN);
        let params = [
            ProxyPath::into_params(|| None),
            crate::api::RolloutPath::into_params(|| None),
        ];
        for first in params.iter().map(|p| serde_json::to_value(&p[0]).unwrap()) {
            assert_eq!(first["schema"]["pattern"], ROLLOUT_ID_PATTERN, "{first}");
        }
    }

    #[test]
    fn rollout_ids_are_one_plain_segment() {
        for ok in [
            "r1",
            "g000001-r3",
            "val0001-0002",
            "a.b_c-D",
            "...",
            &"x".repeat(128),
        ] {
            assert!(check_rollout_id(ok).is_ok(), "{ok}");
        }
        let long = "x".repeat(129);
        for bad in [
            "", ".", "..", "a/b", "a%2Fb", "x%41", "a?b", "a#b", "a\0b", "a\nb", "a b", "é", &long,
        ] {
            assert!(check_rollout_id(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn ids_are_encoded_into_one_path_segment() {
        assert_eq!(
            proxy_base_url("http://gw/", "a b/c", 2, Mode::Val),
            "http://gw/proxy/a%20b%2Fc/2/val/openai/v1"
        );
        assert_eq!(
            anthropic_base_url("http://gw/", "r.1", 3, Mode::Train),
            "http://gw/proxy/r.1/3/train/anthropic"
        );
        assert_eq!(
            events_url("http://gw", "r1"),
            "http://gw/v1/rollouts/r1/events"
        );
    }
}
