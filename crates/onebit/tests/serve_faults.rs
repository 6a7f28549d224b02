//! Issue 31 on the real binary with SmolLM2-135M-Instruct: malformed tool
//! history, unsatisfiable constraints (OpenAI and Ollama routes, whole and
//! streamed), a forced call cut by `max_tokens`, a Pydantic-style schema
//! under a forced choice, numbers bounded in digits, integers beyond 64
//! bits, and Ollama's 404 shape: each a 4xx naming the field or the stated
//! `finish_reason`, never a 500. One server for all, few tokens each.

use std::time::Duration;

use serde_json::{json, Value};

mod common;
use common::Server;

fn post(s: &Server, path: &str, body: &Value) -> (u16, String) {
    common::request(
        s.port,
        "POST",
        path,
        body.to_string().as_bytes(),
        Duration::from_secs(120),
    )
    .unwrap()
}

fn json_of(status: u16, body: &str) -> Value {
    serde_json::from_str(body).unwrap_or_else(|e| panic!("{status} {e}: {body}"))
}

/// A 400 whose OpenAI error names `param` and says `says`.
fn refused(s: &Server, body: &Value, param: &str, says: &str) {
    let (status, text) = post(s, "/v1/chat/completions", body);
    let v = json_of(status, &text);
    assert_eq!(status, 400, "{body}: {text}");
    assert_eq!(v["error"]["param"], param, "{body}: {text}");
    let m = v["error"]["message"].as_str().unwrap();
    assert!(m.contains(says), "{body}: {m}");
    assert!(!m.contains("NoExtensionBias") && !m.contains('\n'), "{m}");
}

const TOOL: &str = r##"{"type": "function", "function": {"name": "book", "description": "Book a table",
  "parameters": {"type": "object", "properties": {"guest": {"$ref": "#/$defs/Person"}, "seats": {"type": "integer"}},
  "required": ["guest", "seats"],
  "$defs": {"Person": {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}}}}}"##;

#[test]
fn bad_requests_of_issue_31_are_4xx_or_a_stated_finish() {
    let s = Server::start(onebit_testdata::SMOLLM2_135M, &[]);
    let user = json!({"role": "user", "content": "Book a table for Ada."});
    let tool: Value = serde_json::from_str(TOOL).unwrap();

    // Items 4 and 7b: history calls that are not objects, with and without tools.
    for calls in [
        json!([1]),
        json!(["x"]),
        json!([[]]),
        json!([null]),
        json!("x"),
    ] {
        for tools in [None, Some(json!([tool]))] {
            let mut body = json!({"messages": [user, {"role": "assistant", "content": null, "tool_calls": calls}], "max_tokens": 1});
            if let Some(t) = tools {
                body["tools"] = t;
            }
            let at = if calls.is_array() {
                "messages[1].tool_calls[0]"
            } else {
                "messages[1].tool_calls"
            };
            refused(&s, &body, "messages", at);
        }
    }
    let (status, text) = post(
        &s,
        "/api/chat",
        &json!({"stream": false, "messages": [user, {"role": "assistant", "content": "", "tool_calls": [1]}]}),
    );
    assert_eq!(status, 400, "{text}");
    assert!(
        json_of(status, &text)["error"]
            .as_str()
            .unwrap()
            .contains("messages[1].tool_calls[0]"),
        "{text}"
    );

    // Item 5: unsatisfiable constraints are 400s naming the field, streamed or not.
    let recursive =
        json!({"type": "json_schema", "json_schema": {"name": "r", "schema": {"$ref": "#"}}});
    for stream in [false, true] {
        refused(
            &s,
            &json!({"messages": [user], "response_format": recursive, "stream": stream, "max_tokens": 4}),
            "response_format",
            "`response_format`",
        );
        for g in ["start: a\na: a \"x\"\n", "start: /[^\\x00-\\U0010ffff]/\n"] {
            refused(
                &s,
                &json!({"messages": [user], "grammar": g, "stream": stream, "max_tokens": 4}),
                "grammar",
                "unsatisfiable",
            );
        }
    }
    let (status, text) = post(
        &s,
        "/api/chat",
        &json!({"stream": false, "messages": [user], "format": {"$ref": "#"}}),
    );
    assert_eq!(status, 400, "{text}");
    let e = json_of(status, &text)["error"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(e.contains("`format`") && e.contains("unsatisfiable"), "{e}");

    // Item 6 and 7a: a Pydantic-style schema under `required`, cut by max_tokens.
    let (status, text) = post(
        &s,
        "/v1/chat/completions",
        &json!({"messages": [user], "tools": [tool], "tool_choice": "required", "max_tokens": 6, "temperature": 0}),
    );
    let v = json_of(status, &text);
    assert_eq!(status, 200, "{text}");
    let c = &v["choices"][0];
    assert_eq!(c["finish_reason"], "length", "{text}");
    assert!(c["message"]["content"].is_null(), "{text}");
    // Named, with room: a whole call whose arguments follow the schema's $defs.
    let (status, text) = post(
        &s,
        "/v1/chat/completions",
        &json!({"messages": [user], "tools": [tool], "tool_choice": {"type": "function", "function": {"name": "book"}}, "max_tokens": 100, "temperature": 0}),
    );
    let v = json_of(status, &text);
    assert_eq!(status, 200, "{text}");
    let call = &v["choices"][0]["message"]["tool_calls"][0]["function"];
    assert_eq!(call["name"], "book", "{text}");
    let args: Value = serde_json::from_str(call["arguments"].as_str().unwrap()).unwrap();
    assert!(
        args["guest"]["name"].is_string() && args["seats"].is_i64(),
        "{args}"
    );

    // Item 7d: a number under response_format ends; the answer is valid JSON.
    let scored = json!({"type": "json_schema", "json_schema": {"name": "s", "schema":
        {"type": "object", "properties": {"score": {"type": "number"}}, "required": ["score"], "additionalProperties": false}}});
    for seed in 0..3 {
        let (status, text) = post(
            &s,
            "/v1/chat/completions",
            &json!({"messages": [{"role": "user", "content": "Rate pi from 0 to 1 with many decimals."}],
                    "response_format": scored, "temperature": 1.0, "seed": seed, "max_tokens": 48}),
        );
        let v = json_of(status, &text);
        let content = v["choices"][0]["message"]["content"].as_str().unwrap();
        let parsed: Value =
            serde_json::from_str(content).unwrap_or_else(|e| panic!("{e}: {content}"));
        assert!(parsed["score"].is_number(), "{content}");
        assert_eq!(v["choices"][0]["finish_reason"], "stop", "{text}");
    }

    // Item 8: 2^64 quoted as sent; an /api 404 in Ollama's shape.
    for field in ["max_tokens", "seed"] {
        let body = format!(
            r#"{{"messages":[{{"role":"user","content":"x"}}],"{field}":18446744073709551616}}"#
        );
        let (status, text) = common::request(
            s.port,
            "POST",
            "/v1/chat/completions",
            body.as_bytes(),
            Duration::from_secs(60),
        )
        .unwrap();
        assert_eq!(status, 400, "{text}");
        assert!(text.contains("got 18446744073709551616"), "{text}");
    }
    let (status, text) =
        common::request(s.port, "GET", "/api/nope", b"", Duration::from_secs(60)).unwrap();
    assert_eq!(status, 404);
    assert!(json_of(status, &text)["error"].is_string(), "{text}");
}
