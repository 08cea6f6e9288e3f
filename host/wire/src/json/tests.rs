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

#[test]
fn a_first_field_joins_an_object_as_serde_reads_it() {
    let value = RawValue::from_string("[1,22,333]".into()).expect("raw");
    for (object, want) in [
        (
            r#"{"a":1,"b":[true]}"#,
            serde_json::json!({"k": [1, 22, 333], "a": 1, "b": [true]}),
        ),
        ("{}", serde_json::json!({"k": [1, 22, 333]})),
        ("{ }", serde_json::json!({"k": [1, 22, 333]})),
        (
            r#"{ "a" : {"x": "}"} }"#,
            serde_json::json!({"k": [1, 22, 333], "a": {"x": "}"}}),
        ),
    ] {
        let object = RawValue::from_string(object.into()).expect("raw");
        let joined = with_first_field(&object, "k", &value).expect("an object");
        assert!(joined.get().starts_with(r#"{"k":[1,22,333]"#), "{joined}");
        let read: Value = serde_json::from_str(joined.get()).expect("valid JSON");
        assert_eq!(read, want);
    }
    // A key that needs escaping is written escaped.
    let object = RawValue::from_string("{}".into()).expect("raw");
    let joined = with_first_field(&object, "q\"", &value).expect("an object");
    assert_eq!(joined.get(), r#"{"q\"":[1,22,333]}"#);
    for other in ["[1]", "\"{\"", "null", "7"] {
        let other = RawValue::from_string(other.into()).expect("raw");
        assert!(with_first_field(&other, "k", &value).is_none(), "{other}");
    }
}
