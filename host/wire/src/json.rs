//! JSON as agl accepts and keeps it: [`JsonText`] holds a document as the
//! text it arrived as, and only documents nested at most [`MAX_DEPTH`]
//! levels deep with finite numbers are let in. Anything deeper, or a number
//! like `1e999`, would be stored fine and then break every reader that
//! parses it into a tree (serde_json's `Value` refuses both), so the check
//! runs wherever a `JsonText` is parsed: request bodies, stored rows, client
//! reads.

use std::fmt;

use serde::de::{self, DeserializeSeed, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize};
use serde_json::Value;
use serde_json::value::RawValue;

/// Deepest nesting of arrays and objects a `JsonText` may hold.
pub const MAX_DEPTH: usize = 100;

/// Checks that `text` is one JSON document nested at most `max_depth`
/// levels with finite numbers only, without building a tree. The error
/// names the limits.
pub fn check(text: &str, max_depth: usize) -> Result<(), String> {
    serde_json::from_str::<IgnoredAny>(text).map_err(|e| limits_error(&e, max_depth))?;
    check_limits(text, max_depth)
}

/// [`check`] of a document serde_json has read already (its syntax is
/// known good): only the limits are left to check, in one pass over the
/// bytes instead of a second parse.
pub fn check_raw(raw: &RawValue, max_depth: usize) -> Result<(), String> {
    check_limits(raw.get(), max_depth)
}

fn limits_error(e: &dyn fmt::Display, max_depth: usize) -> String {
    format!("{e} (agl takes JSON nested at most {max_depth} levels deep, with finite numbers)")
}

/// The limits serde_json's syntax does not impose, over text it has read
/// as one document: nesting depth, and every value serde_json's readers
/// could still refuse read as they would read it. Those are numbers that
/// may not be finite (an exponent, or over 20 characters: `1e999`, 400
/// digits) and strings with `\u` escapes (a lone surrogate); a tree parse
/// of each of those alone decides. The rest (the bulk: token ids, plain
/// text) is only scanned: a table lookup per byte between strings, and
/// strings skipped to their next quote or backslash.
fn check_limits(text: &str, max_depth: usize) -> Result<(), String> {
    let bytes = text.as_bytes();
    let mut depth = 0usize;
    let mut i = 0;
    while let Some(&b) = bytes.get(i) {
        match SCAN[usize::from(b)] {
            Scan::Skip => i += 1,
            Scan::Quote => {
                let start = i;
                // The text is valid JSON, so every string ends.
                let (end, unicode_escape) = string_end(bytes, i).unwrap_or((bytes.len(), false));
                i = end;
                if unicode_escape {
                    check_value(&text[start..i], start, max_depth)?;
                }
            }
            Scan::Open => {
                depth += 1;
                if depth > max_depth {
                    let e = format!("JSON nested deeper than {max_depth} levels at byte {i}");
                    return Err(limits_error(&e, max_depth));
                }
                i += 1;
            }
            Scan::Close => {
                depth = depth.saturating_sub(1);
                i += 1;
            }
            // The `e` of `true` and `false` is no number.
            Scan::Number if !(b == b'-' || b.is_ascii_digit()) => i += 1,
            // Token id lists (most of an engine's answer) are runs of
            // numbers and commas: each number in one pass over its
            // characters, and the run read to its end here.
            Scan::Number => loop {
                let start = i;
                let (end, unbounded) = number_end(bytes, i);
                i = end;
                if unbounded {
                    check_value(&text[start..i], start, max_depth)?;
                }
                match (bytes.get(i), bytes.get(i + 1)) {
                    (Some(b','), Some(b'0'..=b'9')) => i += 1,
                    _ => break,
                }
            },
        }
    }
    Ok(())
}

/// The end of the string whose opening quote is at `i` (just past its
/// closing quote), and whether it has a `\u` escape: a lone surrogate a
/// tree reader refuses, so such a string is read as [`check`] reads it.
/// `None` when it does not end.
#[inline]
pub fn string_end(bytes: &[u8], i: usize) -> Option<(usize, bool)> {
    let mut i = i + 1;
    let mut unicode_escape = false;
    loop {
        i += memchr::memchr2(b'"', b'\\', bytes.get(i..)?)?;
        if bytes[i] == b'"' {
            return Some((i + 1, unicode_escape));
        }
        // An escape is a backslash and (at least) one more byte.
        unicode_escape |= bytes.get(i + 1) == Some(&b'u');
        i += 2;
    }
}

/// The end of the number starting at `i`, and whether it may not be
/// finite (an exponent, or over 20 characters: `1e999`, 400 digits), so
/// that it is read as [`check`] reads it.
#[inline]
pub fn number_end(bytes: &[u8], i: usize) -> (usize, bool) {
    let start = i;
    let mut i = i;
    let mut exponent = false;
    while let Some(&c) = bytes.get(i) {
        match c {
            b'0'..=b'9' | b'+' | b'-' | b'.' => {}
            b'e' | b'E' => exponent = true,
            _ => break,
        }
        i += 1;
    }
    (i, exponent || i - start > 20)
}

/// What [`check_limits`] does at a byte between strings.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Scan {
    Skip,
    Quote,
    Open,
    Close,
    /// A character of a number: digits, sign, point, exponent.
    Number,
}

static SCAN: [Scan; 256] = {
    let mut table = [Scan::Skip; 256];
    table[b'"' as usize] = Scan::Quote;
    table[b'[' as usize] = Scan::Open;
    table[b'{' as usize] = Scan::Open;
    table[b']' as usize] = Scan::Close;
    table[b'}' as usize] = Scan::Close;
    let number = b"0123456789+-.eE";
    let mut i = 0;
    while i < number.len() {
        table[number[i] as usize] = Scan::Number;
        i += 1;
    }
    table
};

/// One scalar value of a document read as a tree reader reads it (`at`: its
/// byte offset in the document, for the error).
fn check_value(value: &str, at: usize, max_depth: usize) -> Result<(), String> {
    let mut de = serde_json::Deserializer::from_str(value);
    Check {
        left: max_depth,
        max: max_depth,
    }
    .deserialize(&mut de)
    .and_then(|()| de.end())
    .map_err(|e| limits_error(&format!("{e} in the value at byte {at}"), max_depth))
}

/// One value being checked, with the nesting levels still allowed below it.
#[derive(Clone, Copy)]
struct Check {
    left: usize,
    max: usize,
}

impl Check {
    fn nested<E: de::Error>(self) -> Result<Check, E> {
        match self.left.checked_sub(1) {
            Some(left) => Ok(Check { left, ..self }),
            None => Err(E::custom(format!(
                "JSON nested deeper than {} levels",
                self.max
            ))),
        }
    }
}

impl<'de> DeserializeSeed<'de> for Check {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Check {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_bool<E>(self, _: bool) -> Result<(), E> {
        Ok(())
    }

    fn visit_i64<E>(self, _: i64) -> Result<(), E> {
        Ok(())
    }

    fn visit_u64<E>(self, _: u64) -> Result<(), E> {
        Ok(())
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<(), E> {
        if v.is_finite() {
            Ok(())
        } else {
            Err(E::custom("number out of range"))
        }
    }

    fn visit_str<E>(self, _: &str) -> Result<(), E> {
        Ok(())
    }

    fn visit_unit<E>(self) -> Result<(), E> {
        Ok(())
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        let inner = self.nested()?;
        while seq.next_element_seed(inner)?.is_some() {}
        Ok(())
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let inner = self.nested()?;
        while map.next_key::<IgnoredAny>()?.is_some() {
            map.next_value_seed(inner)?;
        }
        Ok(())
    }
}

/// A JSON document kept as the text it arrived as. Request and response
/// bodies reach plugins verbatim, and the host never re-serialises the
/// megabytes of history a long rollout's requests carry. Parsing one checks
/// it (see [`check`]).
#[derive(Clone, Serialize)]
#[serde(transparent)]
pub struct JsonText(Box<RawValue>);

impl<'de> Deserialize<'de> for JsonText {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let raw = Box::<RawValue>::deserialize(d)?;
        check_raw(&raw, MAX_DEPTH).map_err(de::Error::custom)?;
        Ok(JsonText(raw))
    }
}

/// Any JSON value (within the limits above): the schema says no more.
impl utoipa::PartialSchema for JsonText {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        utoipa::openapi::ObjectBuilder::new()
            .schema_type(utoipa::openapi::schema::SchemaType::AnyValue)
            .description(Some(format!(
                "Any JSON document nested at most {MAX_DEPTH} levels deep, with finite numbers."
            )))
            .into()
    }
}

impl utoipa::ToSchema for JsonText {}

impl JsonText {
    /// `text` as a checked document.
    pub fn new(text: String, max_depth: usize) -> Result<Self, String> {
        let raw = RawValue::from_string(text).map_err(|e| limits_error(&e, max_depth))?;
        check_raw(&raw, max_depth)?;
        Ok(JsonText(raw))
    }

    pub fn as_str(&self) -> &str {
        self.0.get()
    }

    /// Whether the document is within `max_depth` (and its numbers
    /// finite): [`check_raw`], as a `JsonText` is JSON already.
    pub fn check(&self, max_depth: usize) -> Result<(), String> {
        check_raw(&self.0, max_depth)
    }

    pub fn parse(&self) -> serde_json::Result<Value> {
        serde_json::from_str(self.as_str())
    }

    /// Wraps JSON text that has already been checked (or that agl
    /// serialised itself from checked parts).
    pub fn from_raw(raw: Box<RawValue>) -> Self {
        Self(raw)
    }
}

impl From<Value> for JsonText {
    fn from(v: Value) -> Self {
        Self::from(&v)
    }
}

impl From<&Value> for JsonText {
    fn from(v: &Value) -> Self {
        // Serialising a `Value` cannot fail: its keys are always strings.
        Self(serde_json::value::to_raw_value(v).unwrap_or_else(|_| null()))
    }
}

fn null() -> Box<RawValue> {
    RawValue::NULL.to_owned()
}

impl Default for JsonText {
    fn default() -> Self {
        Self(null())
    }
}

impl PartialEq for JsonText {
    fn eq(&self, other: &Self) -> bool {
        self.as_str() == other.as_str()
    }
}

impl fmt::Debug for JsonText {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl fmt::Display for JsonText {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// `object` (JSON text of an object) with `key: value` written as its
/// first field, without parsing either: how a long value already written
/// (a prompt's token ids) joins a body serialised without it. `None` when
/// `object` is no object. The caller keeps `key` out of `object` (JSON
/// readers differ on duplicate keys).
pub fn with_first_field(object: &RawValue, key: &str, value: &RawValue) -> Option<Box<RawValue>> {
    let rest = object.get().trim_start().strip_prefix('{')?;
    let key = serde_json::to_string(key).ok()?;
    let mut out = String::with_capacity(object.get().len() + key.len() + value.get().len() + 2);
    out.push('{');
    out.push_str(&key);
    out.push(':');
    out.push_str(value.get());
    if !rest.trim_start().starts_with('}') {
        out.push(',');
    }
    out.push_str(rest);
    // SAFETY: `object` is one JSON object (a `RawValue` holds one value,
    // and it opens with `{`), `key` a JSON string as serde_json writes it,
    // `value` one JSON value: a field put before the object's others (with
    // a comma when it has any) leaves one well-formed object, with no
    // whitespace around it.
    Some(unsafe { RawValue::from_string_unchecked(out) })
}

/// A JSON list of token ids (`[1, 2, 3]`), as serde_json reads it into a
/// `Vec<u32>`. A list of plain integers (what engines write) is read off
/// its bytes in one pass with its length counted first, instead of element
/// by element through serde, growing as it goes: the prompt's ids are the
/// bulk of an engine's answer to a long prompt (serde's per-element path
/// was ~40% of reading a proxied call's tokens, and splitting the text on
/// commas and parsing each piece still ~200 instructions an id, in the
/// gateway bench). Anything else in the list is serde_json's to read, or
/// refuse.
pub fn u32_list(raw: &RawValue) -> Result<Vec<u32>, serde_json::Error> {
    plain_u32_list(raw.get()).map_or_else(|| serde_json::from_str(raw.get()), Ok)
}

/// `[` digits `,` ... `]` with JSON whitespace around any token, each
/// number within `u32`; `None` for anything else.
fn plain_u32_list(text: &str) -> Option<Vec<u32>> {
    let bytes = text.as_bytes();
    let (ids, end) = u32_list_prefix(bytes)?;
    bytes[end..]
        .iter()
        .all(|b| matches!(b, b' ' | b'\t' | b'\n' | b'\r'))
        .then_some(ids)
}

/// A plain list of token ids (as [`u32_list`] reads fast) at the start of
/// `bytes`, after any JSON whitespace: the ids and where the list ends
/// (just past its `]`). `None` when what is there is anything else, for
/// serde_json to read.
pub fn u32_list_prefix(bytes: &[u8]) -> Option<(Vec<u32>, usize)> {
    let skip_space = |mut i: usize| {
        while bytes
            .get(i)
            .is_some_and(|b| matches!(b, b' ' | b'\t' | b'\n' | b'\r'))
        {
            i += 1;
        }
        i
    };
    let mut i = skip_space(0);
    if bytes.get(i) != Some(&b'[') {
        return None;
    }
    i = skip_space(i + 1);
    // A plain list ends at its first `]`.
    let close = i + memchr::memchr(b']', bytes.get(i..)?)?;
    let mut ids = Vec::with_capacity(memchr::memchr_iter(b',', &bytes[i..close]).count() + 1);
    if i == close {
        return Some((Vec::new(), close + 1));
    }
    loop {
        let start = i;
        let mut id: u64 = 0;
        while let Some(digit) = bytes
            .get(i)
            .map(|b| b.wrapping_sub(b'0'))
            .filter(|&d| d < 10)
        {
            // Wraps only past 19 digits, refused below.
            id = id.wrapping_mul(10).wrapping_add(u64::from(digit));
            i += 1;
        }
        // No digits (a sign, `null`, a string...), a leading zero that is
        // not the whole number, or more digits than any u32 has: serde's to
        // read, or refuse.
        let digits = i - start;
        if digits == 0 || digits > 10 || (bytes[start] == b'0' && digits > 1) {
            return None;
        }
        ids.push(u32::try_from(id).ok()?);
        i = skip_space(i);
        match bytes.get(i) {
            Some(b',') => i = skip_space(i + 1),
            Some(b']') => return Some((ids, i + 1)),
            // `.`, `e`, anything else.
            _ => return None,
        }
    }
}

pub mod walk;

#[cfg(test)]
mod tests;
