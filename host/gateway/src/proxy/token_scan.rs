//! The token fields of an engine's whole answer, read by walking its text:
//! only the fields a record keeps are looked at, everything else is
//! skipped to its end (strings by `memchr`), and token id lists are read
//! off their bytes. Through serde the same reading took ~34k instructions
//! of a proxied call's ~200k in the gateway bench (callgrind): every
//! skipped field parsed, the prompt's ids parsed once to find their end
//! and once more to read them.
//!
//! It reads the shape engines write; anything else (a key with an escape,
//! a field read twice, a value of another type) is `None`, and the caller
//! reads the answer through serde, which decides. So where this gives an
//! answer it is serde's (`record::tokens_by_serde`, pinned by the tests).
//!
//! The same walk checks the limits a record's JSON is held to
//! (`json::check_raw` at [`MAX_DEPTH`]): nesting, and the values a tree
//! reader could refuse (numbers with an exponent or over 20 characters,
//! strings with `\u` escapes), each read as `json::check` reads it. An
//! answer is `Some` only within them, so the caller need not walk the text
//! a second time for them; outside them it is `None`, and the caller's own
//! check gives the error.

use agl_wire::json::{self, walk::Walker};
use serde_json::Value;

use super::record::{Tokens, version_text};

/// What one choice holds.
#[derive(Default)]
struct Choice {
    prompt_ids: Option<Option<Vec<u32>>>,
    token_ids: Option<Option<Vec<u32>>>,
    versions: Option<Option<Vec<u64>>>,
    logprobs: Option<Option<Vec<f32>>>,
    finish_reason: Option<Option<String>>,
}

/// How deep an engine's answer may nest: a record keeps it one level down.
pub const MAX_DEPTH: usize = json::MAX_DEPTH - 1;

/// The token fields of each choice of `body` (JSON text), or `None`; `Some`
/// also means `body` is within the limits (nested at most [`MAX_DEPTH`]).
pub fn scan(body: &[u8]) -> Option<Vec<Tokens>> {
    let mut r = Walker::new(body, MAX_DEPTH);
    let mut prompt = None;
    let mut choices: Option<Vec<Choice>> = None;
    let mut version = None;
    r.object(|r, key| match key {
        b"prompt_token_ids" => once(&mut prompt, ids(r)?),
        b"weight_version" => once(&mut version, r.serde::<Option<Value>>()?),
        b"choices" => {
            let mut all = Vec::new();
            r.array(|r| {
                all.push(choice(r)?);
                Some(())
            })?;
            once(&mut choices, all)
        }
        _ => r.skip(),
    })?;
    if !r.at_end() {
        return None;
    }
    let choices = choices.filter(|c| !c.is_empty())?;
    let version = version.flatten().as_ref().and_then(version_text);
    let prompt = prompt.flatten();
    let tokens = choices.into_iter().map(|c| Tokens {
        prompt_ids: match &prompt {
            Some(ids) => ids.clone(),
            None => c.prompt_ids.flatten().unwrap_or_default(),
        },
        response_ids: c.token_ids.flatten().unwrap_or_default(),
        response_logprobs: c.logprobs.flatten().unwrap_or_default(),
        finish_reason: c.finish_reason.flatten(),
        engine_weight_version: version.clone(),
        response_versions: c.versions.flatten().unwrap_or_default(),
    });
    Some(tokens.collect())
}

/// `body` (an engine's answer) with each echo of the prompt (a
/// `prompt_token_ids` list of integers, at the top or on a choice) cut to
/// `[]`, for serde to read the rest: the rendered path sent those ids and
/// reads past them. Cutting, the walk included, took ~106k instructions
/// a call where serde_json's skip of the echo took ~630k (the rendering
/// bench, callgrind).
/// `None` when nothing was cut or the walk does not answer (as [`scan`]);
/// the caller then reads `body` whole. What serde reads either way is the
/// same but for the contents of lists it skips.
pub fn without_prompt_echo(body: &[u8]) -> Option<Vec<u8>> {
    let mut r = Walker::new(body, MAX_DEPTH);
    let mut cuts: Vec<std::ops::Range<usize>> = Vec::new();
    r.object(|r, key| match key {
        b"prompt_token_ids" => echo(r, &mut cuts),
        b"choices" => r.array(|r| {
            r.object(|r, key| match key {
                b"prompt_token_ids" => echo(r, &mut cuts),
                _ => r.skip(),
            })
        }),
        _ => r.skip(),
    })?;
    if !r.at_end() || cuts.is_empty() {
        return None;
    }
    let mut out = Vec::with_capacity(body.len());
    let mut at = 0;
    for cut in cuts {
        out.extend_from_slice(&body[at..cut.start]);
        out.extend_from_slice(b"[]");
        at = cut.end;
    }
    out.extend_from_slice(&body[at..]);
    Some(out)
}

/// How long the compact list of non-negative integers (`[1,22,333]`, as
/// engines write one) at the start of `bytes` is, through its `]`; `None`
/// for anything else (whitespace included), which serde reads instead.
/// Only checked, not read: one pass without branches (a loop that reads
/// the ids costs ~70 instructions an id).
fn int_list_len(bytes: &[u8]) -> Option<usize> {
    let rest = bytes.strip_prefix(b"[")?;
    let close = memchr::memchr(b']', rest)?;
    compact_ints(&rest[..close]).then_some(close + 2)
}

/// `s` is integers without sign, fraction or leading zero, each followed
/// by a comma but the last (or `s` is empty): valid JSON between `[]`.
fn compact_ints(s: &[u8]) -> bool {
    let digit = |b: u8| b.wrapping_sub(b'0') < 10;
    let (Some(&first), Some(&last)) = (s.first(), s.last()) else {
        return true;
    };
    let leading_zero = first == b'0' && s.get(1).copied().is_some_and(digit);
    // Each window checks its middle byte, an empty item after it and a
    // leading zero at it; the ends are checked apart. `&` rather than
    // `&&`: no branches, so the compiler can vectorise it.
    let middle = s.windows(3).fold(true, |ok, w| {
        let comma = w[1] == b',';
        ok & (digit(w[1]) | comma)
            & !(comma & (w[2] == b','))
            & !((w[0] == b',') & (w[1] == b'0') & digit(w[2]))
    });
    digit(first) && digit(last) && !leading_zero && middle
}

/// Sets a field seen for the first time (serde refuses a repeated one).
fn once<T>(slot: &mut Option<T>, value: T) -> Option<()> {
    if slot.is_some() {
        return None;
    }
    *slot = Some(value);
    Some(())
}

/// An echo of the prompt: a compact integer list is noted in `cuts`
/// and passed; anything else is skipped, for serde to read.
fn echo(r: &mut Walker, cuts: &mut Vec<std::ops::Range<usize>>) -> Option<()> {
    let start = r.position();
    match r.read(|rest| int_list_len(rest).map(|len| (len, len))) {
        Some(len) => cuts.push(start..start + len),
        None => r.skip()?,
    }
    Some(())
}

/// A list of token ids, or `null`.
fn ids(r: &mut Walker) -> Option<Option<Vec<u32>>> {
    if r.null() {
        return Some(None);
    }
    r.read(json::u32_list_prefix).map(Some)
}

fn choice(r: &mut Walker) -> Option<Choice> {
    let mut c = Choice::default();
    r.object(|r, key| match key {
        b"prompt_token_ids" => once(&mut c.prompt_ids, ids(r)?),
        b"token_ids" => once(&mut c.token_ids, ids(r)?),
        b"token_weight_versions" => once(&mut c.versions, r.serde()?),
        b"logprobs" => once(&mut c.logprobs, logprobs(r)?),
        b"finish_reason" => once(&mut c.finish_reason, r.serde()?),
        _ => r.skip(),
    })?;
    Some(c)
}

/// A choice's `logprobs` (`null`, chat's `content` entries, or
/// completions' `token_logprobs`) as the record keeps them.
fn logprobs(r: &mut Walker) -> Option<Option<Vec<f32>>> {
    if r.null() {
        return Some(None);
    }
    let mut content: Option<Option<Vec<f32>>> = None;
    let mut plain: Option<Option<Vec<Option<f64>>>> = None;
    r.object(|r, key| match key {
        b"content" => {
            let entries = if r.null() {
                None
            } else {
                let mut all = Vec::new();
                r.array(|r| {
                    all.push(entry(r)? as f32);
                    Some(())
                })?;
                Some(all)
            };
            once(&mut content, entries)
        }
        b"token_logprobs" => once(&mut plain, r.serde()?),
        _ => r.skip(),
    })?;
    Some(Some(match (content.flatten(), plain.flatten()) {
        (Some(c), _) => c,
        (None, Some(t)) => t.into_iter().map(|x| x.unwrap_or(0.0) as f32).collect(),
        (None, None) => Vec::new(),
    }))
}

/// One chat logprobs entry: its `logprob`, which it must have.
fn entry(r: &mut Walker) -> Option<f64> {
    let mut logprob = None;
    r.object(|r, key| match key {
        b"logprob" => once(&mut logprob, r.serde::<f64>()?),
        _ => r.skip(),
    })?;
    logprob
}

#[cfg(test)]
mod tests {
    use super::super::record::tokens_by_serde;
    use super::*;
    use serde_json::json;

    /// Where the scan answers, serde's reading gives the same, and the
    /// body is within the limits the record's check holds it to.
    fn agrees(body: &str) -> bool {
        let scanned = scan(body.as_bytes());
        if let Some(t) = &scanned {
            assert_eq!(Some(t), tokens_by_serde(body.as_bytes()).as_ref(), "{body}");
            assert_eq!(json::check(body, MAX_DEPTH), Ok(()), "{body}");
        }
        scanned.is_some()
    }

    /// An answer outside the limits, anywhere in it (a field the scan
    /// skips, one it reads), is not answered: the caller's own check
    /// refuses it. Within them, values a tree reader takes (an exponent,
    /// an escape) are answered.
    #[test]
    fn an_answer_outside_the_json_limits_is_not_answered() {
        let nested = |depth: usize| "[".repeat(depth) + &"]".repeat(depth);
        // The scan's own levels: the answer's object, `choices`, a choice.
        let within = format!(r#"{{"choices": [{{"x": {}}}]}}"#, nested(MAX_DEPTH - 3));
        let deep = format!(r#"{{"choices": [{{"x": {}}}]}}"#, nested(MAX_DEPTH - 2));
        let deep_top = format!(r#"{{"x": {}, "choices": [{{}}]}}"#, nested(MAX_DEPTH));
        let long = "1".repeat(400);
        let outside = [
            deep,
            deep_top,
            r#"{"choices": [{"token_ids": [1]}], "x": 1e999}"#.to_string(),
            format!(r#"{{"choices": [{{"token_ids": [1]}}], "x": [{long}]}}"#),
            r#"{"choices": [{"token_ids": [1], "x": {"s": "\ud800"}}]}"#.to_string(),
            r#"{"choices": [{"token_ids": [1], "y": {"\udc00": 1}}]}"#.to_string(),
            r#"{"choices": [{"logprobs": {"content": [{"logprob": -1e999}]}}]}"#.to_string(),
            r#"{"weight_version": [1e400], "choices": [{}]}"#.to_string(),
        ];
        for body in &outside {
            assert!(json::check(body, MAX_DEPTH).is_err(), "{body}");
            assert!(scan(body.as_bytes()).is_none(), "{body}");
        }
        for body in [
            within,
            r#"{"choices": [{"token_ids": [1]}], "x": [1.5e-05, -2E+3, 0.5]}"#.to_string(),
            r#"{"choices": [{"logprobs": {"content": [{"logprob": -1.5e-05}]}}]}"#.to_string(),
            r#"{"choices": [{"message": {"content": "\u00e9\ud83d\ude00"}}]}"#.to_string(),
            format!(r#"{{"choices": [{{}}], "x": {}}}"#, "9".repeat(20)),
        ] {
            assert!(agrees(&body), "{body}");
        }
    }

    #[test]
    fn engine_answers_are_read_as_serde_reads_them() {
        let chat = json!({"id": "c", "object": "chat.completion", "model": "m",
            "prompt_token_ids": [1, 2, 3],
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "a \"q\" \\ }]",
                "tool_calls": [{"function": {"arguments": "{\"x\": [1]}"}}]},
                "logprobs": {"content": [{"token": "a", "logprob": -0.25, "bytes": [97],
                    "top_logprobs": [{"token": "b", "logprob": -3}]},
                    {"token": "}", "logprob": -1e-3, "bytes": [125], "top_logprobs": []}]},
                "finish_reason": "stop", "stop_reason": null, "token_ids": [4, 5]}],
            "usage": {"prompt_tokens": 3, "completion_tokens": 2}});
        let completions = json!({"weight_version": "v7", "choices": [
            {"index": 0, "text": "x", "prompt_token_ids": [9], "token_ids": [8],
             "token_weight_versions": [2], "logprobs": {"token_logprobs": [null, -0.5],
             "tokens": ["x"], "top_logprobs": null}, "finish_reason": "length"},
            {"index": 1, "prompt_token_ids": null, "token_ids": [], "logprobs": null,
             "finish_reason": null}]});
        for body in [&chat, &completions] {
            assert!(agrees(&body.to_string()), "{body}");
            assert!(
                agrees(&serde_json::to_string_pretty(body).unwrap()),
                "{body}"
            );
        }
        let t = scan(chat.to_string().as_bytes()).unwrap();
        assert_eq!(t[0].prompt_ids, vec![1, 2, 3]);
        assert_eq!(t[0].response_ids, vec![4, 5]);
        assert_eq!(t[0].response_logprobs, vec![-0.25, -1e-3]);
        assert_eq!(t[0].finish_reason.as_deref(), Some("stop"));
        let t = scan(completions.to_string().as_bytes()).unwrap();
        assert_eq!(t[0].engine_weight_version.as_deref(), Some("v7"));
        assert_eq!(t[0].response_logprobs, vec![0.0, -0.5]);
        assert_eq!(t[0].response_versions, vec![2]);
        assert_eq!(
            t[1],
            Tokens {
                engine_weight_version: Some("v7".into()),
                ..Tokens::default()
            }
        );
    }

    #[test]
    fn what_it_does_not_read_is_left_to_serde() {
        // Each is serde's to read (or refuse): the scan must not answer
        // differently, and these it leaves alone.
        for body in [
            r#"{"choices": []}"#,
            r#"{"choices": null}"#,
            r#"{"prompt_token_ids": [1], "prompt_token_ids": [2], "choices": [{}]}"#,
            r#"{"choices": [{"token_ids": [1], "token_ids": [1]}]}"#,
            r#"{"choices": [{"token_ids": ["x"]}]}"#,
            r#"{"choices": [{"token_ids": [-1]}]}"#,
            r#"{"choices": [{"token_ids": [1.0]}]}"#,
            r#"{"choices": [{"token_ids": [4294967296]}]}"#,
            r#"{"choices": [{"logprobs": {"content": [{"token": "a"}]}}]}"#,
            r#"{"choices": [{"logprobs": {"content": [{"logprob": null}]}}]}"#,
            r#"{"choices": [{"logprobs": 3}]}"#,
            r#"{"choices": [{"finish_reason": 3}]}"#,
            r#"{"ch\u006fices": [{"token_ids": [1]}]}"#,
            r#"[1, 2]"#,
            r#"{"choices": [{"token_ids": [1]}]} "#,
        ] {
            agrees(body);
        }
        // ...and reads these as serde does.
        for body in [
            r#"{"choices": [{}]}"#,
            r#"{"choices": [{"finish_reason": "a\"b"}], "weight_version": null}"#,
            r#"{"choices": [{"token_ids": [ 1 , 2 ] , "logprobs": {"content": null}}]}"#,
            r#"{"choices": [{"logprobs": {"content": [], "token_logprobs": [-1]}}]}"#,
            r#"{"weight_version": 3, "other": {"a": [{"b": "]}"}]}, "choices": [{"x": true}]}"#,
        ] {
            assert!(agrees(body), "{body}");
        }
    }

    /// The echo is cut where it is a compact integer list and what serde
    /// then reads of the answer is what it reads of the whole.
    #[test]
    fn a_cut_echo_reads_as_the_whole_answer() {
        use agl_wire::openai::Completion;
        use serde::de::IgnoredAny;
        let read = |b: &[u8]| serde_json::from_slice::<Completion<IgnoredAny>>(b).ok();
        let cut = [
            r#"{"choices": [{"text": "]", "prompt_token_ids": [1,22,333], "token_ids": [4]}]}"#,
            r#"{"prompt_token_ids":[0,10,4294967296],"choices":[{"text":"a\"b"}]}"#,
            r#"{"choices":[{"prompt_token_ids":[7]},{"prompt_token_ids":[],"index":1}]}"#,
            r#"{"choices":[{"prompt_token_ids":[7],"prompt_token_ids":[8]}]}"#,
        ];
        for body in cut {
            let short = without_prompt_echo(body.as_bytes()).expect(body);
            assert!(short.len() < body.len() || body.contains("[]"), "{body}");
            assert_eq!(read(&short), read(body.as_bytes()), "{body}");
        }
        let whole = [
            r#"{"choices": [{"prompt_token_ids": null}]}"#,
            r#"{"choices": [{"prompt_token_ids": [1, 2]}]}"#,
            r#"{"choices": [{"text": "\"prompt_token_ids\":[1]"}]}"#,
            r#"{"ch\u006fices": [{"prompt_token_ids": [1]}]}"#,
            r#"{"choices": [{"prompt_token_ids": [1]}]} x"#,
            r#"[1]"#,
        ];
        for body in whole {
            assert_eq!(without_prompt_echo(body.as_bytes()), None, "{body}");
        }
    }

    /// A list passes uncut-for-serde only when serde_json reads it as a
    /// list of integers; anything else is left for serde to read (or
    /// refuse).
    #[test]
    fn only_compact_integer_lists_are_passed() {
        let passed = [
            "[]",
            "[0]",
            "[1,22,333]",
            "[0,0,10]",
            "[18446744073709551616]",
            "[9,0]",
        ];
        for list in passed {
            assert_eq!(
                int_list_len(format!("{list},1]").as_bytes()),
                Some(list.len()),
                "{list}"
            );
            assert!(
                serde_json::from_str::<Vec<serde_json::Number>>(list).is_ok(),
                "{list}"
            );
        }
        let left = [
            "[01]", "[00]", "[1,02]", "[1,,2]", "[,1]", "[1,]", "[,]", "[ 1]", "[1 ,2]", "[1, 2]",
            "[-1]", "[1.0]", "[1e3]", r#"["1"]"#, "[null]", "[[1]]", "[1", "1", "",
        ];
        for list in left {
            assert_eq!(int_list_len(list.as_bytes()), None, "{list}");
        }
    }
}
