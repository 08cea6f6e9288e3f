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
    let rest = |i: usize| bytes.get(i..).unwrap_or_default();
    let mut depth = 0usize;
    let mut i = 0;
    while let Some(&b) = bytes.get(i) {
        match SCAN[usize::from(b)] {
            Scan::Skip => i += 1,
            Scan::Quote => {
                let start = i;
                let mut unicode_escape = false;
                i += 1;
                // The text is valid JSON, so every string ends; an escape
                // is a backslash and (at least) one more byte.
                while let Some(at) = memchr::memchr2(b'"', b'\\', rest(i)) {
                    i += at;
                    if bytes[i] == b'"' {
                        break;
                    }
                    unicode_escape |= bytes.get(i + 1) == Some(&b'u');
                    i += 2;
                }
                i += 1;
                if unicode_escape {
                    check_value(&text[start..i.min(text.len())], start, max_depth)?;
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
                let mut exponent = false;
                while let Some(&c) = bytes.get(i) {
                    match c {
                        b'0'..=b'9' | b'+' | b'-' | b'.' => {}
                        b'e' | b'E' => exponent = true,
                        _ => break,
                    }
                    i += 1;
                }
                if i - start > 20 || exponent {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_id_lists_read_as_serde_json_reads_them() {
        let cases = [
            "[]",
            "[ ]",
            "[7]",
            "[0, 1,2 ,\n 4294967295]",
            "[4294967296]",
            "[-1]",
            "[-0]",
            "[1.0]",
            "[1e2]",
            "[null]",
            "[\"1\"]",
            "[[1]]",
            "{}",
            "3",
            "[0]",
            "[ 0 , 10 ]",
            "[9999999999]",
            "[42949672950]",
            "[1.5]",
            "[1e0]",
            "[\t1\r\n]",
        ];
        for text in cases {
            let raw = RawValue::from_string(text.to_string()).expect("JSON");
            let ours = u32_list(&raw).map_err(|e| e.to_string());
            let serde = serde_json::from_str::<Vec<u32>>(text).map_err(|e| e.to_string());
            assert_eq!(ours, serde, "{text}");
        }
        let raw = RawValue::from_string("[5, 6]".into()).expect("JSON");
        assert_eq!(u32_list(&raw).expect("ids"), vec![5, 6]);
        // Lists as engines write them, with ids up to and past u32::MAX.
        let mut seed = 0x9e37_79b9_7f4a_7c15_u64;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        for _ in 0..500 {
            let n = next() % 20;
            let items: Vec<String> = (0..n)
                .map(|_| {
                    let id = match next() % 4 {
                        0 => next() % 10,
                        1 => u64::from(u32::MAX) - next() % 3,
                        2 => u64::from(u32::MAX) + 1 + next() % 3,
                        _ => next() % 200_000,
                    };
                    let pad = [" ", "", "\n", "  "][(next() % 4) as usize];
                    format!("{pad}{id}{pad}")
                })
                .collect();
            let text = format!("[{}]", items.join(","));
            let raw = RawValue::from_string(text.clone()).expect("JSON");
            let ours = u32_list(&raw).map_err(|e| e.to_string());
            let serde = serde_json::from_str::<Vec<u32>>(&text).map_err(|e| e.to_string());
            assert_eq!(ours, serde, "{text}");
        }
        // Not JSON (never a RawValue): the fast path leaves it alone.
        for text in ["[01]", "[1,]", "[,1]", "[1 2]", "[1]x", "[", "1]"] {
            assert_eq!(plain_u32_list(text), None, "{text}");
        }
    }

    fn nested(depth: usize) -> String {
        format!("{}{}", "[".repeat(depth), "]".repeat(depth))
    }

    #[test]
    fn depth_and_numbers_are_bounded() {
        assert!(check(&nested(MAX_DEPTH), MAX_DEPTH).is_ok());
        let deep = check(&nested(MAX_DEPTH + 1), MAX_DEPTH).unwrap_err();
        assert!(deep.contains("deeper than 100"), "{deep}");
        // Iterative parsers take 100,000 levels; this check must too.
        assert!(check(&nested(100_000), MAX_DEPTH).is_err());
        for bad in ["1e999", "[-1e999]", r#"{"x": {"y": 1e400}}"#, "[1,", "1 2"] {
            let e = check(bad, MAX_DEPTH).unwrap_err();
            assert!(e.contains("finite numbers"), "{bad}: {e}");
        }
        for good in [r#"{"a": [1, -2.5e10, "1e999", null, true]}"#, "0", r#""x""#] {
            assert!(check(good, MAX_DEPTH).is_ok(), "{good}");
        }
    }

    /// The scan agrees with reading the whole document as a tree (what
    /// `check` did before the scan, and what a later reader does).
    #[test]
    fn the_scan_agrees_with_a_tree_read() {
        let docs = [
            r#"{"a": "[[[[", "b": "\\", "c": "\"]]]]\"", "d": [[1]]}"#,
            r#"["\ud800"]"#,
            r#"{"\udc00": 1}"#,
            r#"["\ud83d\ude00", "\u00e9", "\\u0041", "\\ud800"]"#,
            r#"[1e308, 1E-400, -2.5e+10, 1.7976931348623157e308, 1.8e308]"#,
            r#"[12345678901234567890, -1234567890123456789012, 0.000000000000000000001]"#,
            r#"{"x": [true, false, null, {"e": "E"}], "y": -0}"#,
            r#"[true,false,1e5,-1E-5,true]"#,
            r#"  [ 1 , [ 2 , [ 3 ] ] ]  "#,
        ];
        let long_number = format!("[{}]", "9".repeat(400));
        let long_finite = format!("[{}]", "9".repeat(300));
        let all = docs.iter().map(|d| d.to_string()).chain([
            long_number,
            long_finite,
            nested(4),
            format!("{{\"a\":{}}}", nested(2)),
        ]);
        for doc in all {
            for depth in 0..6 {
                assert_eq!(
                    check(&doc, depth).is_ok(),
                    check_value(&doc, 0, depth).is_ok(),
                    "{doc} at depth {depth}: {:?}",
                    check(&doc, depth)
                );
            }
        }
    }

    /// Random documents of the shapes the scan treats apart (escapes,
    /// exponents, long numbers, literals, nesting): the scan and a tree
    /// read agree on every one, at every depth limit.
    #[test]
    fn the_scan_agrees_with_a_tree_read_on_random_documents() {
        const SCALARS: [&str; 14] = [
            "0",
            "-17",
            "3.25",
            "1e3",
            "-2E-7",
            "1e400",
            "9e-400",
            "true",
            "false",
            "null",
            r#""plain""#,
            r#""a\"b\\""#,
            r#""\u00e9\ud83d\ude00""#,
            r#""\udbff""#,
        ];
        let mut seed = 0x2545_f491_4f6c_dd1d_u64;
        let mut next = move |n: usize| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (seed % n as u64) as usize
        };
        fn value(next: &mut dyn FnMut(usize) -> usize, out: &mut String, left: usize) {
            match (next(4), left) {
                (0, 1..) => {
                    out.push('[');
                    for i in 0..next(4) {
                        if i > 0 {
                            out.push(',');
                        }
                        value(next, out, left - 1);
                    }
                    out.push(']');
                }
                (1, 1..) => {
                    out.push('{');
                    for i in 0..next(4) {
                        if i > 0 {
                            out.push(',');
                        }
                        out.push_str(SCALARS[10 + next(4)]);
                        out.push(':');
                        value(next, out, left - 1);
                    }
                    out.push('}');
                }
                _ if next(6) == 0 => out.push_str(&"7".repeat(300 + next(20))),
                _ => out.push_str(SCALARS[next(SCALARS.len())]),
            }
        }
        for _ in 0..2_000 {
            let mut doc = String::new();
            value(&mut next, &mut doc, 5);
            for depth in 0..6 {
                assert_eq!(
                    check(&doc, depth).is_ok(),
                    check_value(&doc, 0, depth).is_ok(),
                    "{doc} at depth {depth}"
                );
            }
        }
    }

    #[test]
    fn a_raw_value_is_checked_for_the_limits_alone() {
        let raw = RawValue::from_string(format!("{{\"k\": {}}}", nested(3))).unwrap();
        assert!(check_raw(&raw, 4).is_ok());
        assert!(check_raw(&raw, 3).unwrap_err().contains("deeper than 3"));
        let lone = RawValue::from_string(r#"{"k": "\udfff"}"#.into()).unwrap();
        assert!(check_raw(&lone, MAX_DEPTH).is_err(), "a lone surrogate");
        let text = JsonText::new(r#"[1e999]"#.into(), MAX_DEPTH);
        assert!(text.unwrap_err().contains("finite numbers"));
    }

    #[test]
    fn parsing_a_json_text_checks_it() {
        let ok: JsonText = serde_json::from_str(r#"{"a": [1]}"#).unwrap();
        assert_eq!(ok.as_str(), r#"{"a": [1]}"#);
        assert!(serde_json::from_str::<JsonText>("[1e999]").is_err());
        assert!(serde_json::from_str::<JsonText>(&nested(MAX_DEPTH + 1)).is_err());
        assert!(JsonText::new(nested(3), 2).is_err());
        assert!(JsonText::new(nested(2), 2).is_ok());
    }
}
