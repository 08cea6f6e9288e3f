//! A token-id list as JSON text (`[1,2,3]`): the rendered path sends a
//! prompt of tens of thousands of ids per call. Read without serde's
//! per-element calls, which cost several times a plain loop.

use serde_json::value::RawValue;

/// `ids` as a JSON array, the text serde_json writes for them. Written by
/// serde_json straight into a raw value: a list written by hand must then
/// pass `RawValue::from_string`'s syntax check, which cost more than the
/// writing itself (~90 instructions per id against ~70; callgrind, the
/// rendering bench's ~7k-id prompts), where serde_json's own writer is ~80
/// per id and checks nothing it wrote.
pub fn to_raw(ids: &[u32]) -> Box<RawValue> {
    // A list of integers always serialises.
    serde_json::value::to_raw_value(ids).unwrap_or_else(|_| RawValue::NULL.to_owned())
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
