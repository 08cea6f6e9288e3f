//! The readable view of `agl plugin test` and `agl plugin inspect`.

use std::io::{IsTerminal, Write};

use agl_plugin_host::Inspection;
use agl_tokenizer::Tokenizer;
use agl_wire::rollout::{Rollout, Sample};

/// How much to show and whether to colour it.
pub struct Style {
    color: bool,
    full_prompt: bool,
}

impl Style {
    pub fn for_stdout(full_prompt: bool) -> Self {
        Self {
            color: std::io::stdout().is_terminal(),
            full_prompt,
        }
    }

    fn paint(&self, code: &str, text: &str) -> String {
        if self.color {
            format!("\x1b[{code}m{text}\x1b[0m")
        } else {
            text.to_string()
        }
    }
}

/// Characters of prompt shown (its end) unless `--full`.
const PROMPT_TAIL: usize = 160;

pub fn rollout_header(
    out: &mut impl Write,
    r: &Rollout,
    reward: Option<f64>,
) -> std::io::Result<()> {
    let reward = reward.map_or("-".to_string(), |v| format!("{v}"));
    writeln!(
        out,
        "rollout {}  group {}  attempt {}  {}  {} calls  reward {}",
        r.id,
        r.group_id,
        r.attempt,
        format!("{:?}", r.status).to_lowercase(),
        r.calls.len(),
        reward
    )
}

/// One sample: a header, then its prompt (tail) and the response cut into
/// `TRAIN` (sampled, trained) and `context` (masked) segments.
pub fn sample(
    out: &mut impl Write,
    index: usize,
    s: &Sample,
    tok: Option<&Tokenizer>,
    style: &Style,
) -> std::io::Result<()> {
    if let Some(b) = &s.break_before {
        writeln!(
            out,
            "  {} {} at call {}: {}",
            style.paint("33", "break"),
            b.kind.as_str(),
            b.call_index,
            b.detail
        )?;
    }
    writeln!(
        out,
        "  sample {index}  calls {:?}  agent {}  weight v{}  prompt {} tok  response {} tok ({} trained)",
        s.source_calls,
        s.agent.as_deref().unwrap_or("-"),
        s.weight_version,
        s.prompt_ids.len(),
        s.response_ids.len(),
        s.trainable_tokens()
    )?;
    let prompt = show(&s.prompt_ids, tok);
    let prompt = if style.full_prompt {
        prompt
    } else {
        tail(&prompt, PROMPT_TAIL)
    };
    writeln!(out, "    prompt  | {prompt}")?;
    for (trained, range) in s.runs() {
        let text = show(&s.response_ids[range], tok);
        if trained {
            writeln!(
                out,
                "    {} | {}",
                style.paint("1;32", "TRAIN  "),
                style.paint("32", &text)
            )?;
        } else {
            writeln!(
                out,
                "    {} | {}",
                style.paint("2", "context"),
                style.paint("2", &text)
            )?;
        }
    }
    Ok(())
}

/// Decoded text (escaped so newlines stay visible), or the raw ids.
fn show(ids: &[u32], tok: Option<&Tokenizer>) -> String {
    match tok.map(|t| t.decode(ids, false)) {
        Some(Ok(text)) => format!("{:?}", text),
        _ => format!("{ids:?}"),
    }
}

fn tail(text: &str, chars: usize) -> String {
    let n = text.chars().count();
    if n <= chars {
        return text.to_string();
    }
    let rest: String = text.chars().skip(n - chars).collect();
    format!("…{rest}")
}

pub fn inspection(out: &mut impl Write, i: &Inspection) -> std::io::Result<()> {
    writeln!(out, "plugin   {}", i.path.display())?;
    writeln!(out, "name     {} {}", i.info.name, i.info.version)?;
    if !i.info.description.is_empty() {
        writeln!(out, "about    {}", i.info.description)?;
    }
    writeln!(out, "world    {} (agl:adapter@{})", i.world.as_str(), i.wit)?;
    let mut list = |label: &str, items: &[agl_plugin_host::Item]| -> std::io::Result<()> {
        for (n, item) in items.iter().enumerate() {
            let head = if n == 0 { label } else { "" };
            writeln!(out, "{head:<8} {}: {}", item.name, item.ty)?;
        }
        Ok(())
    };
    list("exports", &i.exports)?;
    list("imports", &i.imports)?;
    writeln!(
        out,
        "hash     {} (compiled component {})",
        i.load.wasm_hash,
        if i.load.cache_hit {
            "from cache"
        } else {
            "compiled now"
        }
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use agl_wire::rollout::Span;

    #[test]
    fn segments_alternate_context_and_trained() {
        let s = Sample {
            prompt_ids: vec![1],
            response_ids: vec![1, 2, 3, 4, 5, 6],
            trainable: vec![Span { start: 0, end: 2 }, Span { start: 4, end: 5 }],
            logprobs: vec![0.0; 6],
            source_calls: vec![0, 1],
            weight_version: 0,
            agent: None,
            break_before: None,
        };
        assert_eq!(
            s.runs(),
            vec![(true, 0..2), (false, 2..4), (true, 4..5), (false, 5..6)]
        );
        assert_eq!(tail("abcdef", 3), "…def");
    }
}
