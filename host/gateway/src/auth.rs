//! Who is calling: the admin (management key as Bearer) or the agent of one
//! rollout attempt (a per-attempt token). Rollout tokens are
//! `agl-rt-<hex(id)>.<attempt>.<hex(mac)>` with mac = HMAC-SHA256(secret,
//! id NUL attempt): the id and attempt inside let a valid token for another
//! rollout or an older attempt be told apart (403) from a forged or garbled
//! one (401). A retried rollout's new attempt gets a new token, so an agent
//! of the failed attempt that is still alive cannot write into it. Both
//! checks compare in constant time.

use std::collections::HashMap;
use std::sync::Mutex;

use axum::extract::{Request, State};
use axum::http::HeaderMap;
use axum::http::header::AUTHORIZATION;
use axum::middleware::Next;
use axum::response::Response;
use hmac::{Hmac, Mac};
use sha2::Sha256;

use super::AppState;
use super::error::ApiError;
use super::extract::ApiPath;

type HmacSha256 = Hmac<Sha256>;

const TOKEN_PREFIX: &str = "agl-rt-";

/// Verified tokens kept before the memo starts over (an entry per rollout
/// attempt that called lately; bounds memory on long runs).
const MAX_VERIFIED: usize = 65_536;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Principal {
    Admin,
    /// An agent holding the token of this rollout attempt.
    Rollout(RolloutAttempt),
}

/// The rollout attempt a token was issued for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RolloutAttempt {
    pub id: String,
    pub attempt: u32,
}

impl RolloutAttempt {
    /// Refuses (403) a token of another rollout or of another attempt than
    /// `attempt` (the one the route addresses, or the rollout's current).
    pub fn check(&self, id: &str, attempt: u32) -> Result<(), ApiError> {
        if self.id != id {
            return Err(ApiError::forbidden(
                "this rollout token is not valid for that rollout",
            ));
        }
        if self.attempt != attempt {
            return Err(ApiError::forbidden(format!(
                "this rollout token is for attempt {}, not attempt {attempt}",
                self.attempt
            )));
        }
        Ok(())
    }
}

/// Issues and checks tokens; `admin_key: None` turns auth off.
pub struct Auth {
    admin_key: Option<String>,
    /// HMAC keyed with the secret once: each token's check or issue starts
    /// from a copy (keying hashes the secret's two pads, half the work of
    /// a check).
    keyed: HmacSha256,
    /// Rollout tokens whose MAC verified, by their text. An agent presents
    /// the same token on every call, and its check (hex decoding and an
    /// HMAC) was ~11k of the ~155k instructions a proxied call costs
    /// (callgrind). A token stays valid as long as the secret, which is the
    /// process's, so nothing is invalidated; a forged token is never kept.
    /// The map's hasher is keyed per process, so a lookup's timing tells a
    /// caller nothing it could aim at a valid token.
    verified: Mutex<HashMap<Box<str>, RolloutAttempt>>,
}

impl Auth {
    pub fn new(admin_key: Option<String>, secret: Vec<u8>) -> Self {
        Auth {
            admin_key: admin_key.filter(|k| !k.is_empty()),
            // HMAC takes keys of any length, so this cannot fail.
            keyed: HmacSha256::new_from_slice(&secret).expect("HMAC accepts any key"),
            verified: Mutex::default(),
        }
    }

    pub fn enabled(&self) -> bool {
        self.admin_key.is_some()
    }

    fn mac(&self, rollout_id: &str, attempt: u32) -> HmacSha256 {
        let mut mac = self.keyed.clone();
        // NUL cannot occur in a rollout id, so (id, attempt) pairs never
        // collide.
        mac.update(rollout_id.as_bytes());
        mac.update(b"\0");
        mac.update(attempt.to_string().as_bytes());
        mac
    }

    /// The token the agent of `rollout_id`'s `attempt` authenticates with.
    pub fn rollout_token(&self, rollout_id: &str, attempt: u32) -> String {
        let tag = self.mac(rollout_id, attempt).finalize().into_bytes();
        format!(
            "{TOKEN_PREFIX}{}.{attempt}.{}",
            hex::encode(rollout_id),
            hex::encode(tag)
        )
    }

    /// Identifies the caller from the `Authorization` header.
    pub fn identify(&self, headers: &HeaderMap) -> Result<Principal, ApiError> {
        let Some(admin_key) = &self.admin_key else {
            return Ok(Principal::Admin);
        };
        let presented = bearer(headers)?;
        if let Some(rest) = presented.strip_prefix(TOKEN_PREFIX) {
            return self.rollout_of(rest).map(Principal::Rollout);
        }
        if constant_eq(presented.as_bytes(), admin_key.as_bytes()) {
            Ok(Principal::Admin)
        } else {
            Err(ApiError::unauthorized("invalid API key"))
        }
    }

    /// The attempt a rollout token (without its prefix) was issued for,
    /// from the memo of verified tokens or checked and added to it.
    fn rollout_of(&self, rest: &str) -> Result<RolloutAttempt, ApiError> {
        // A poisoned lock only means a panic elsewhere while it was held;
        // the map is whole either way.
        let mut verified = self.verified.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(known) = verified.get(rest) {
            return Ok(known.clone());
        }
        drop(verified);
        let who = self.check_rollout_token(rest)?;
        verified = self.verified.lock().unwrap_or_else(|e| e.into_inner());
        if verified.len() >= MAX_VERIFIED {
            verified.clear();
        }
        verified.insert(rest.into(), who.clone());
        Ok(who)
    }

    fn check_rollout_token(&self, rest: &str) -> Result<RolloutAttempt, ApiError> {
        let garbled = || ApiError::unauthorized("invalid rollout token");
        let mut parts = rest.split('.');
        let (Some(id_hex), Some(attempt), Some(tag_hex), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(garbled());
        };
        let id = hex::decode(id_hex)
            .ok()
            .and_then(|b| String::from_utf8(b).ok())
            .ok_or_else(garbled)?;
        let attempt: u32 = attempt.parse().map_err(|_| garbled())?;
        let tag = hex::decode(tag_hex).map_err(|_| garbled())?;
        self.mac(&id, attempt)
            .verify_slice(&tag)
            .map_err(|_| garbled())?;
        Ok(RolloutAttempt { id, attempt })
    }
}

/// The presented key: `Authorization: Bearer KEY`, or `x-api-key: KEY`
/// (how the Anthropic SDK and Claude Code send it).
fn bearer(headers: &HeaderMap) -> Result<&str, ApiError> {
    if headers.get(AUTHORIZATION).is_none()
        && let Some(key) = headers.get("x-api-key")
    {
        return key
            .to_str()
            .ok()
            .map(str::trim)
            .filter(|v| !v.is_empty())
            .ok_or_else(|| ApiError::unauthorized("malformed x-api-key header"));
    }
    let value = headers.get(AUTHORIZATION).ok_or_else(|| {
        ApiError::unauthorized("missing Authorization: Bearer (or x-api-key) header")
    })?;
    value
        .to_str()
        .ok()
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim)
        .filter(|v| !v.is_empty())
        .ok_or_else(|| ApiError::unauthorized("malformed Authorization header"))
}

/// Equal-length inputs are compared without an early exit; the admin key's
/// length is not treated as secret.
fn constant_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Middleware: only the admin may pass.
pub async fn require_admin(
    State(state): State<AppState>,
    req: Request,
    next: Next,
) -> Result<Response, ApiError> {
    match state.auth.identify(req.headers())? {
        Principal::Admin => Ok(next.run(req).await),
        Principal::Rollout(_) => Err(ApiError::forbidden(
            "a rollout token cannot use management routes",
        )),
    }
}

/// Middleware for `/v1/rollouts/{id}/...`: the admin, or the agent of `{id}`.
/// The principal is left in the request extensions for the handler.
pub async fn require_rollout_access(
    State(state): State<AppState>,
    ApiPath(id): ApiPath<String>,
    mut req: Request,
    next: Next,
) -> Result<Response, ApiError> {
    let who = state.auth.identify(req.headers())?;
    // The attempt is checked by the handler, against the rollout's record.
    if let Principal::Rollout(own) = &who
        && own.id != id
    {
        return Err(ApiError::forbidden(
            "this rollout token is not valid for that rollout",
        ));
    }
    req.extensions_mut().insert(who);
    Ok(next.run(req).await)
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn headers(token: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(
            AUTHORIZATION,
            HeaderValue::from_str(&format!("Bearer {token}")).unwrap(),
        );
        h
    }

    #[test]
    fn tokens_identify_their_rollout_attempt_and_reject_forgeries() {
        let auth = Auth::new(Some("adm".into()), b"secret".to_vec());
        let t = auth.rollout_token("r-1", 2);
        let who = RolloutAttempt {
            id: "r-1".into(),
            attempt: 2,
        };
        assert_eq!(
            auth.identify(&headers(&t)).unwrap(),
            Principal::Rollout(who.clone())
        );
        assert!(who.check("r-1", 2).is_ok());
        assert_eq!(who.check("r-1", 3).unwrap_err().status, 403);
        assert_eq!(who.check("r-2", 2).unwrap_err().status, 403);
        assert_eq!(auth.identify(&headers("adm")).unwrap(), Principal::Admin);
        let other = Auth::new(Some("adm".into()), b"other".to_vec()).rollout_token("r-1", 2);
        // The attempt is inside the MAC: rewriting it garbles the token.
        let bumped = t.replacen(".2.", ".3.", 1);
        for bad in [
            other.as_str(),
            bumped.as_str(),
            "agl-rt-zz.1.00",
            "agl-rt-",
            "nope",
            "adm2",
        ] {
            let e = auth.identify(&headers(bad)).unwrap_err();
            assert_eq!(e.status, 401, "{bad}");
        }
        assert_eq!(auth.identify(&HeaderMap::new()).unwrap_err().status, 401);
    }

    #[test]
    fn a_verified_token_is_remembered_and_its_forgeries_still_refused() {
        let auth = Auth::new(Some("adm".into()), b"secret".to_vec());
        let t = auth.rollout_token("r-1", 2);
        let first = auth.identify(&headers(&t)).unwrap();
        assert_eq!(auth.identify(&headers(&t)).unwrap(), first);
        // The last hex digit of the tag changed, the id changed (same
        // length), the token cut short, the token extended.
        let last = t.chars().last().unwrap();
        let flipped = format!(
            "{}{}",
            &t[..t.len() - 1],
            if last == '0' { '1' } else { '0' }
        );
        let other_id = t.replacen(&hex::encode("r-1"), &hex::encode("r-2"), 1);
        let cut = t[..t.len() - 2].to_string();
        let longer = format!("{t}0");
        for bad in [&flipped, &other_id, &cut, &longer] {
            assert_eq!(
                auth.identify(&headers(bad)).unwrap_err().status,
                401,
                "{bad}"
            );
        }
        // Only the verified token is kept.
        let verified = auth.verified.lock().unwrap();
        assert_eq!(verified.len(), 1);
        assert!(verified.contains_key(t.strip_prefix(TOKEN_PREFIX).unwrap()));
    }

    #[test]
    fn no_admin_key_means_everyone_is_admin() {
        let auth = Auth::new(None, b"s".to_vec());
        assert!(!auth.enabled());
        assert_eq!(auth.identify(&HeaderMap::new()).unwrap(), Principal::Admin);
    }
}
