//! A forced `tool_choice` on a policy whose template writes no tool calls
//! (SmolLM2's, say, with no `[engine] tool_parser`): a 400 in each API's
//! own shape that says why, never an answer as if it were `auto`; nothing
//! reaches the engine. `auto` and `none` are still served.

use agl_conversation::{Family, Renderer, ToolFormat};
use agl_testengine::{Reply, TestEngineConfig};
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::rendered::chat as post;
use crate::support::rendering_r1;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forced_call_without_a_tool_format_is_refused_in_every_api() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (tok, eos) = crate::policy::tools_policy(dir.path());
    let plain = Family {
        tools: ToolFormat::None,
        reasoning: false,
    };
    let renderer = Renderer::new(tok, &[eos])
        .expect("renderer")
        .with_family(plain);
    let engine = TestEngineConfig::default().with_script(|_| Reply::text("Hello."));
    let env = rendering_r1(engine, renderer).await;
    let base = format!("{}/proxy/r1/1/train", env.base);
    let chat_tools = json!([{"type": "function",
        "function": {"name": "bash", "parameters": {"type": "object"}}}]);
    let fn_tools = json!([{"type": "function", "name": "bash", "parameters": {"type": "object"}}]);
    let claude_tools = json!([{"name": "bash", "input_schema": {"type": "object"}}]);
    let user = json!([{"role": "user", "content": "List the files."}]);

    let forced = [
        (
            env.chat_url("r1"),
            json!({"messages": user, "tools": chat_tools,
                   "tool_choice": {"type": "function", "function": {"name": "bash"}}}),
            "/error/message",
        ),
        (
            env.chat_url("r1"),
            json!({"messages": user, "tools": chat_tools, "tool_choice": "required"}),
            "/error/message",
        ),
        (
            format!("{base}/anthropic/v1/messages"),
            json!({"model": "p", "max_tokens": 16, "tools": claude_tools, "messages": user,
                   "tool_choice": {"type": "any"}}),
            "/error/message",
        ),
        (
            format!("{base}/openai/v1/responses"),
            json!({"model": "p", "tools": fn_tools, "input": "List the files.",
                   "tool_choice": {"type": "function", "name": "bash"}}),
            "/error/message",
        ),
    ];
    for (url, body, message) in forced {
        let resp = post(&url, body.clone()).await;
        assert_eq!(resp.status(), StatusCode::BAD_REQUEST, "{body}");
        let err: Value = resp.json().await.expect("a JSON error");
        let text = err
            .pointer(message)
            .and_then(Value::as_str)
            .unwrap_or_default();
        assert!(text.contains("tool_parser"), "{url}: {err}");
    }
    // The Messages error is in Anthropic's shape.
    let resp = post(
        &format!("{base}/anthropic/v1/messages"),
        json!({"model": "p", "max_tokens": 16, "tools": claude_tools, "messages": user,
               "tool_choice": {"type": "tool", "name": "bash"}}),
    )
    .await;
    let err: Value = resp.json().await.expect("json");
    assert_eq!(err["type"], "error", "{err}");
    assert_eq!(err["error"]["type"], "invalid_request_error", "{err}");
    assert!(env.engine.requests().is_empty(), "nothing sent on");

    for choice in [json!("auto"), json!("none")] {
        let resp = post(
            &env.chat_url("r1"),
            json!({"messages": user, "tools": chat_tools, "tool_choice": choice}),
        )
        .await;
        assert_eq!(resp.status(), StatusCode::OK, "{choice}");
        let answer: Value = resp.json().await.expect("json");
        assert_eq!(answer["choices"][0]["message"]["content"], "Hello.");
    }
}
