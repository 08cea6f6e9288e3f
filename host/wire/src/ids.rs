//! A token-id list as JSON text (`[1,2,3]`), written and read without
//! serde's per-element calls: the rendered path sends a prompt of tens of
//! thousands of ids per call, and serde's element-wise list costs several
//! times a plain loop.

use serde_json::value::RawValue;

/// `ids` as a JSON array, the text serde_json writes for them.
pub fn to_raw(ids: &[u32]) -> Box<RawValue> {
    let mut text = String::with_capacity(2 + ids.len() * 6);
    text.push('[');
    let mut digits = itoa::Buffer::new();
    for (i, &id) in ids.iter().enumerate() {
        if i > 0 {
            text.push(',');
        }
        text.push_str(digits.format(id));
    }
    text.push(']');
    // A list of integers is always JSON.
    RawValue::from_string(text).unwrap_or_else(|_| RawValue::NULL.to_owned())
}

/// `raw` (valid JSON, as a [`RawValue`] holds) as a flat list of `u32`s;
/// `None` when it is anything else: another type, a negative, fractional
/// or exponent number, an id past `u32::MAX`.
pub fn parse(raw: &str) -> Option<Vec<u32>> {
    let inner = raw.strip_prefix('[')?.strip_suffix(']')?;
    let mut ids = Vec::with_capacity(inner.len() / 4);
    let (mut id, mut digits) = (0u32, 0usize);
    for &b in inner.as_bytes() {
        match b {
            // Valid JSON has no leading zeros, so digits only accumulate.
            b'0'..=b'9' => {
                id = id.checked_mul(10)?.checked_add(u32::from(b - b'0'))?;
                digits += 1;
            }
            b',' if digits > 0 => {
                ids.push(id);
                (id, digits) = (0, 0);
            }
            b' ' | b'\t' | b'\n' | b'\r' => {}
            _ => return None,
        }
    }
    if digits > 0 {
        ids.push(id);
    }
    Some(ids)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_written_as_serde_json_writes_them() {
        for ids in [
            vec![],
            vec![0],
            vec![1, 22, 333],
            vec![u32::MAX, 0, 10, 99_999],
        ] {
            let want = serde_json::to_string(&ids).expect("json");
            assert_eq!(to_raw(&ids).get(), want);
            assert_eq!(parse(&want), Some(ids));
        }
    }

    #[test]
    fn the_loop_reads_what_serde_reads() {
        for raw in [
            "[]",
            "[ ]",
            "[0]",
            "[1,2,3]",
            "[ 1 , 2\n,\t3 ]",
            "[4294967295]",
            "[4294967296]",
            "[-1]",
            "[1.0]",
            "[1e3]",
            "[\"1\"]",
            "[[1]]",
            "[null]",
            "[true]",
            "\"x\"",
            "{}",
            "[99999999999999999999]",
            "7",
        ] {
            let serde = serde_json::from_str::<Vec<u32>>(raw).ok();
            assert_eq!(parse(raw), serde, "{raw}");
        }
    }
}
