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
    let mut de = serde_json::Deserializer::from_str(text);
    Check {
        left: max_depth,
        max: max_depth,
    }
    .deserialize(&mut de)
    .and_then(|()| de.end())
    .map_err(|e| {
        format!("{e} (agl takes JSON nested at most {max_depth} levels deep, with finite numbers)")
    })
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
        check(raw.get(), MAX_DEPTH).map_err(de::Error::custom)?;
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
        check(&text, max_depth)?;
        RawValue::from_string(text)
            .map(JsonText)
            .map_err(|e| e.to_string())
    }

    pub fn as_str(&self) -> &str {
        self.0.get()
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

#[cfg(test)]
mod tests {
    use super::*;

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
