//! Hugging Face chat templates rendered with minijinja, byte-compatible with
//! transformers' `apply_chat_template(tokenize=False)`: trim/lstrip blocks,
//! Python string methods (pycompat), a `tojson` that matches `json.dumps`,
//! `raise_exception` and `strftime_now`.

use minijinja::value::{Kwargs, Value};
use minijinja::{Environment, Error, ErrorKind};
use serde::Serialize;

const NAME: &str = "chat";

/// A compiled chat template plus the special tokens it may reference.
pub struct ChatTemplate {
    env: Environment<'static>,
    source: String,
    bos_token: Option<String>,
    eos_token: Option<String>,
}

impl ChatTemplate {
    pub fn new(
        source: &str,
        bos_token: Option<String>,
        eos_token: Option<String>,
    ) -> Result<Self, Error> {
        let mut env = Environment::new();
        env.set_syntax(
            minijinja::syntax::SyntaxConfig::builder()
                .trim_blocks(true)
                .lstrip_blocks(true)
                .build()?,
        );
        minijinja_contrib::add_to_environment(&mut env);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_filter("tojson", tojson);
        env.add_function("raise_exception", |msg: String| -> Result<Value, Error> {
            Err(Error::new(ErrorKind::InvalidOperation, msg))
        });
        env.add_function("strftime_now", strftime_now);
        env.add_template_owned(NAME, strip_generation_tags(source))?;
        Ok(Self {
            env,
            source: source.to_string(),
            bos_token,
            eos_token,
        })
    }

    /// The template's Jinja source, as configured.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// Renders `messages` (and `tools`, if any) as a prompt string.
    pub fn render(
        &self,
        messages: &serde_json::Value,
        tools: Option<&serde_json::Value>,
        add_generation_prompt: bool,
    ) -> Result<String, Error> {
        #[derive(Serialize)]
        struct Ctx<'a> {
            messages: &'a serde_json::Value,
            tools: Option<&'a serde_json::Value>,
            add_generation_prompt: bool,
            bos_token: &'a str,
            eos_token: &'a str,
        }
        let ctx = Ctx {
            messages,
            tools,
            add_generation_prompt,
            bos_token: self.bos_token.as_deref().unwrap_or(""),
            eos_token: self.eos_token.as_deref().unwrap_or(""),
        };
        self.env
            .get_template(NAME)?
            .render(Value::from(minijinja::value::Serde(&ctx)))
    }
}

/// `{% generation %}` is a transformers-only tag marking assistant text;
/// rendering is the same without it.
fn strip_generation_tags(source: &str) -> String {
    let re = regex::Regex::new(r"\{%-?\s*(end)?generation\s*-?%\}").expect("static regex");
    re.replace_all(source, "").into_owned()
}

fn strftime_now(format: String) -> String {
    // Templates like SmolLM3's print today's date; rendering must not depend
    // on the wall clock mid-rollout, but a fixed fallback would be wrong too,
    // so use the real date in UTC.
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0);
    let (y, m, d) = civil_from_days(secs.div_euclid(86_400));
    const MONTHS: [&str; 12] = [
        "January",
        "February",
        "March",
        "April",
        "May",
        "June",
        "July",
        "August",
        "September",
        "October",
        "November",
        "December",
    ];
    let month = MONTHS[(m - 1) as usize];
    format
        .replace("%Y", &y.to_string())
        .replace("%m", &format!("{m:02}"))
        .replace("%d", &format!("{d:02}"))
        .replace("%B", month)
        .replace("%b", &month[..3])
}

/// Days since 1970-01-01 to (year, month, day); Howard Hinnant's algorithm.
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

/// `tojson` as transformers defines it: `json.dumps(x, ensure_ascii=False,
/// indent=..., separators=..., sort_keys=...)`. minijinja's own filter
/// HTML-escapes `<>&'`, which would change prompts.
fn tojson(value: Value, kwargs: Kwargs) -> Result<Value, Error> {
    let ensure_ascii: Option<bool> = kwargs.get("ensure_ascii")?;
    let indent: Option<usize> = kwargs.get("indent")?;
    let separators: Option<Vec<String>> = kwargs.get("separators")?;
    let sort_keys: Option<bool> = kwargs.get("sort_keys")?;
    kwargs.assert_all_used()?;
    let json = serde_json::to_value(&value)
        .map_err(|e| Error::new(ErrorKind::InvalidOperation, e.to_string()))?;
    let (item_sep, key_sep) = match separators.as_deref() {
        Some([item, key]) => (item.clone(), key.clone()),
        Some(_) => {
            return Err(Error::new(
                ErrorKind::InvalidOperation,
                "separators must be a pair",
            ));
        }
        None if indent.is_some() => (",".into(), ": ".into()),
        None => (", ".into(), ": ".into()),
    };
    let mut out = String::new();
    let dumper = PyDumps {
        ensure_ascii: ensure_ascii.unwrap_or(false),
        indent,
        item_sep,
        key_sep,
        sort_keys: sort_keys.unwrap_or(false),
    };
    dumper.write(&json, 0, &mut out);
    Ok(Value::from_safe_string(out))
}

/// A writer that reproduces Python's `json.dumps` byte for byte.
pub(crate) struct PyDumps {
    pub ensure_ascii: bool,
    pub indent: Option<usize>,
    pub item_sep: String,
    pub key_sep: String,
    pub sort_keys: bool,
}

impl PyDumps {
    pub(crate) fn write(&self, v: &serde_json::Value, depth: usize, out: &mut String) {
        use serde_json::Value as J;
        match v {
            J::Null => out.push_str("null"),
            J::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
            J::Number(n) => out.push_str(&py_number(n)),
            J::String(s) => self.write_str(s, out),
            J::Array(items) => {
                if items.is_empty() {
                    out.push_str("[]");
                    return;
                }
                out.push('[');
                for (i, item) in items.iter().enumerate() {
                    self.separator(i, depth + 1, out);
                    self.write(item, depth + 1, out);
                }
                self.newline(depth, out);
                out.push(']');
            }
            J::Object(map) => {
                if map.is_empty() {
                    out.push_str("{}");
                    return;
                }
                let mut entries: Vec<_> = map.iter().collect();
                if self.sort_keys {
                    entries.sort_by(|a, b| a.0.cmp(b.0));
                }
                out.push('{');
                for (i, (k, item)) in entries.into_iter().enumerate() {
                    self.separator(i, depth + 1, out);
                    self.write_str(k, out);
                    out.push_str(&self.key_sep);
                    self.write(item, depth + 1, out);
                }
                self.newline(depth, out);
                out.push('}');
            }
        }
    }

    fn separator(&self, i: usize, depth: usize, out: &mut String) {
        if i > 0 {
            out.push_str(&self.item_sep);
        }
        self.newline(depth, out);
    }

    fn newline(&self, depth: usize, out: &mut String) {
        if let Some(n) = self.indent {
            out.push('\n');
            out.extend(std::iter::repeat_n(' ', n * depth));
        }
    }

    fn write_str(&self, s: &str, out: &mut String) {
        out.push('"');
        for c in s.chars() {
            match c {
                '"' => out.push_str("\\\""),
                '\\' => out.push_str("\\\\"),
                '\n' => out.push_str("\\n"),
                '\r' => out.push_str("\\r"),
                '\t' => out.push_str("\\t"),
                '\u{08}' => out.push_str("\\b"),
                '\u{0c}' => out.push_str("\\f"),
                c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
                c if self.ensure_ascii && !c.is_ascii() => {
                    let mut buf = [0u16; 2];
                    for unit in c.encode_utf16(&mut buf) {
                        out.push_str(&format!("\\u{unit:04x}"));
                    }
                }
                c => out.push(c),
            }
        }
        out.push('"');
    }
}

/// Python's float repr: shortest round-trip digits, `.0` on integral values,
/// exponent form outside 1e-4..1e16.
fn py_number(n: &serde_json::Number) -> String {
    if n.is_i64() || n.is_u64() {
        return n.to_string();
    }
    let f = n.as_f64().unwrap_or(f64::NAN);
    if !f.is_finite() {
        return if f.is_nan() {
            "NaN".into()
        } else if f > 0.0 {
            "Infinity".into()
        } else {
            "-Infinity".into()
        };
    }
    let abs = f.abs();
    if abs != 0.0 && !(1e-4..1e16).contains(&abs) {
        // Rust: "1e20" / "1.5e-7"; Python: "1e+20" / "1.5e-07".
        let s = format!("{f:e}");
        let (mantissa, exp) = s.split_once('e').unwrap_or((&s, "0"));
        let exp: i32 = exp.parse().unwrap_or(0);
        let sign = if exp < 0 { '-' } else { '+' };
        return format!("{mantissa}e{sign}{:02}", exp.abs());
    }
    let s = format!("{f:?}");
    if s.contains('.') || s.contains('e') {
        s
    } else {
        format!("{s}.0")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn dumps(v: serde_json::Value) -> String {
        let mut out = String::new();
        PyDumps {
            ensure_ascii: false,
            indent: None,
            item_sep: ", ".into(),
            key_sep: ": ".into(),
            sort_keys: false,
        }
        .write(&v, 0, &mut out);
        out
    }

    #[test]
    fn tojson_matches_python_json_dumps() {
        // Expected strings are what CPython 3.11 json.dumps prints.
        assert_eq!(
            dumps(json!({"b": 1, "a": [1.5, "x<y>&'z'", null, true]})),
            r#"{"b": 1, "a": [1.5, "x<y>&'z'", null, true]}"#
        );
        assert_eq!(dumps(json!(1e20)), "1e+20");
        assert_eq!(dumps(json!(2.0)), "2.0");
        assert_eq!(dumps(json!(1.5e-7)), "1.5e-07");
        assert_eq!(dumps(json!("é\u{1}")), "\"é\\u0001\"");
    }

    #[test]
    fn renders_with_python_methods_and_tojson_kwargs() {
        let src = "{% for m in messages %}{{ m.role.upper() }}:{{ m.content.strip() }}\n{% endfor %}\
                   {% if tools %}{{ tools | tojson(indent=2) }}{% endif %}\
                   {% if add_generation_prompt %}ASSISTANT:{% endif %}";
        let t = ChatTemplate::new(src, None, None).unwrap();
        let out = t
            .render(
                &json!([{"role": "user", "content": " hi "}]),
                Some(&json!([{"n": 1}])),
                true,
            )
            .unwrap();
        assert_eq!(out, "USER:hi\n[\n  {\n    \"n\": 1\n  }\n]ASSISTANT:");
    }

    #[test]
    fn raise_exception_is_an_error_and_generation_tags_are_ignored() {
        let t = ChatTemplate::new(
            "{% generation %}{{ messages[0].content }}{% endgeneration %}\
             {% if messages | length > 1 %}{{ raise_exception('only one') }}{% endif %}",
            None,
            None,
        )
        .unwrap();
        assert_eq!(
            t.render(&json!([{"content": "x"}]), None, false).unwrap(),
            "x"
        );
        let err = t
            .render(&json!([{"content": "x"}, {"content": "y"}]), None, false)
            .unwrap_err();
        assert!(err.to_string().contains("only one"), "{err}");
    }

    #[test]
    fn civil_dates() {
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(civil_from_days(20_757), (2026, 10, 31));
    }
}
