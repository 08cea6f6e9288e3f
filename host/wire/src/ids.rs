//! Token-id lists as JSON text (`[1,22,333]`). A rendered call's prompt
//! is tens of thousands of ids, written into the engine's request, the
//! harness's answer and the record: through serde's per-element calls
//! that is ~70 instructions an id, here ~14 for ids below 1000 and a few
//! more per further three digits (callgrind, the rendering bench).
//!
//! Fields holding ids serialise through [`serialize`] with
//! `#[serde(serialize_with)]` (the `model_request` record's); they read
//! back as any `Vec<u32>` does. Only for types written as JSON: the raw
//! value it writes is serde_json's.

use serde::{Serialize, Serializer};
use serde_json::value::RawValue;

/// `ids` as a JSON array, the text serde_json writes for them.
pub fn json(ids: &[u32]) -> Box<RawValue> {
    let text = write(ids);
    // SAFETY: `write` gives `[`, then integers without sign or leading
    // zero separated by commas, then `]`: one well-formed JSON value with
    // no whitespace around it (pinned against serde_json in the tests;
    // debug builds re-parse it).
    unsafe { RawValue::from_string_unchecked(text) }
}

/// `#[serde(serialize_with)]` for a `Vec<u32>` of token ids.
pub fn serialize<S: Serializer>(ids: &[u32], s: S) -> Result<S::Ok, S::Error> {
    json(ids).serialize(s)
}

/// Bytes written per id at most by one step of [`write`]'s loop (a
/// comma and ten digits, in fixed 4-byte copies).
const STEP: usize = 16;

fn write(ids: &[u32]) -> String {
    // Ids are written into a stack chunk with fixed-size copies (no
    // per-id length checks or `memcpy` calls) and the chunk appended when
    // full.
    const CHUNK: usize = 1024;
    let mut out = String::with_capacity(ids.len() * 4 + 2);
    let mut chunk = [0u8; CHUNK + STEP];
    let mut at = 0;
    for &id in ids {
        at = item(&mut chunk, at, id as usize);
        if at >= CHUNK {
            out.push_str(ascii(&chunk[..at]));
            at = 0;
        }
    }
    out.push_str(ascii(&chunk[..at]));
    if out.is_empty() {
        return "[]".to_string();
    }
    // Every id was written after a comma: the first comma opens the list.
    out.replace_range(..1, "[");
    out.push(']');
    out
}

/// Writes `,n` at `chunk[at..]` (which has [`STEP`] bytes of room);
/// returns where it ends. Up to three leading digits come from [`LEAD`],
/// each further three from [`GROUP`]; every division is by a constant
/// (a multiply, no `div`).
#[inline]
fn item(chunk: &mut [u8], at: usize, n: usize) -> usize {
    let (lead, groups) = if n < 1_000 {
        (n, 0)
    } else if n < 1_000_000 {
        (n / 1_000, 1)
    } else if n < 1_000_000_000 {
        (n / 1_000_000, 2)
    } else {
        (n / 1_000_000_000, 3)
    };
    chunk[at..at + 4].copy_from_slice(&LEAD.0[lead]);
    let mut at = at + usize::from(LEAD.1[lead]);
    let mut group = |g: usize| {
        chunk[at..at + 4].copy_from_slice(&GROUP[g % 1000]);
        at += 3;
    };
    if groups >= 3 {
        group(n / 1_000_000);
    }
    if groups >= 2 {
        group(n / 1_000);
    }
    if groups >= 1 {
        group(n);
    }
    at
}

/// The chunk's text: ASCII digits and commas, so the check always passes.
fn ascii(bytes: &[u8]) -> &str {
    std::str::from_utf8(bytes).unwrap_or_default()
}

/// `,n` for each `n` below 1000, padded to 4 bytes, and its length.
static LEAD: ([[u8; 4]; 1000], [u8; 1000]) = {
    let mut text = [[0u8; 4]; 1000];
    let mut len = [0u8; 1000];
    let mut n = 0;
    while n < 1000 {
        let digits = if n >= 100 {
            3
        } else if n >= 10 {
            2
        } else {
            1
        };
        let all = three_digits(n);
        text[n][0] = b',';
        let mut i = 0;
        while i < digits {
            text[n][1 + i] = all[3 - digits + i];
            i += 1;
        }
        len[n] = 1 + digits as u8;
        n += 1;
    }
    (text, len)
};

/// Each `n` below 1000 as three digits, zero-padded (a group after the
/// leading one), padded to 4 bytes.
static GROUP: [[u8; 4]; 1000] = {
    let mut text = [[0u8; 4]; 1000];
    let mut n = 0;
    while n < 1000 {
        text[n] = three_digits(n);
        n += 1;
    }
    text
};

const fn three_digits(n: usize) -> [u8; 4] {
    [
        b'0' + (n / 100 % 10) as u8,
        b'0' + (n / 10 % 10) as u8,
        b'0' + (n % 10) as u8,
        0,
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_written_as_serde_json_writes_them() {
        let mut cases = vec![
            vec![],
            vec![0],
            vec![1, 22, 333],
            vec![u32::MAX, 0, 10, 99_999],
        ];
        // Each length of number and each group boundary, and a list long
        // enough to cross many chunks.
        let edges: Vec<u32> = (0..10)
            .flat_map(|p| {
                let b = 10u64.pow(p);
                [b - 1, b, b + 1, b * 2 + 7]
            })
            .chain([999_999, 1_000_000, 1_000_001, 999_999_999, 1_000_000_000])
            .chain([u64::from(u32::MAX) - 1, u64::from(u32::MAX)])
            .filter_map(|n| u32::try_from(n).ok())
            .collect();
        cases.push(edges);
        cases.push(
            (0..20_000u32)
                .map(|i| i.wrapping_mul(2_654_435_761) >> (i % 32))
                .collect(),
        );
        for ids in cases {
            let want = serde_json::to_string(&ids).expect("json");
            assert_eq!(json(&ids).get(), want);
            let back: Vec<u32> = serde_json::from_str(json(&ids).get()).expect("parses");
            assert_eq!(back, ids);
        }
    }

    #[test]
    fn fields_serialise_through_it_as_plain_lists() {
        #[derive(Serialize)]
        struct Fields {
            #[serde(serialize_with = "serialize")]
            all: Vec<u32>,
            #[serde(serialize_with = "serialize")]
            empty: Vec<u32>,
        }
        let fields = Fields {
            all: vec![5, 1000],
            empty: vec![],
        };
        let text = serde_json::to_string(&fields).expect("json");
        assert_eq!(text, r#"{"all":[5,1000],"empty":[]}"#);
        // Into a tree too, as the raw value's parse.
        let tree = serde_json::to_value(&fields).expect("value");
        assert_eq!(tree["all"], serde_json::json!([5, 1000]));
    }
}
