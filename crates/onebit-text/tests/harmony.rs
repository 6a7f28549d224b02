//! gpt-oss's chat template (harmony) rendered exactly as Python jinja2 set up
//! as transformers renders it, and as the official `openai-harmony` package
//! renders the same conversation wherever the template agrees with it; both
//! references written by `scripts/gen_harmony_refs.py`, the date pinned on
//! both sides.

use onebit_text::{ChatTemplate, TemplateTokens};
use serde_json::Value;

fn refs() -> Value {
    let p = onebit_testdata::dir().join("refs").join("harmony.json");
    let text = std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    serde_json::from_str(&text).unwrap()
}

fn template(refs: &Value) -> ChatTemplate {
    let name = refs["template"].as_str().unwrap();
    let src =
        std::fs::read_to_string(onebit_testdata::dir().join("chat-templates").join(name)).unwrap();
    let s = |k: &str| refs["special_tokens"][k].as_str().map(str::to_string);
    let t = ChatTemplate::new(
        &src,
        TemplateTokens {
            bos_token: s("bos_token"),
            eos_token: s("eos_token"),
            ..Default::default()
        },
    )
    .unwrap();
    t.pin_now(refs["now"].as_i64());
    t
}

#[test]
fn gpt_oss_template_renders_as_jinja2_and_as_openai_harmony() {
    let refs = refs();
    let t = template(&refs);
    let (mut n, mut same_as_harmony) = (0, Vec::new());
    for c in refs["cases"].as_array().unwrap() {
        let name = c["name"].as_str().unwrap();
        let got = t
            .render(&c["messages"], true, c["extra"].as_object())
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(got, c["template"].as_str().unwrap(), "{name}: vs jinja2");
        if !c["harmony_differs"].as_bool().unwrap() {
            assert_eq!(
                got,
                c["harmony"].as_str().unwrap(),
                "{name}: vs openai-harmony"
            );
            same_as_harmony.push(name);
        }
        n += 1;
    }
    eprintln!("{n} conversations equal jinja2's rendering; equal to openai-harmony's too: {same_as_harmony:?}");
    // Every reasoning effort, a system prompt beside tools, and a model
    // identity agree with openai-harmony byte for byte.
    for want in [
        "user-low",
        "user-medium",
        "user-high",
        "tools-system-high",
        "model-identity",
    ] {
        assert!(same_as_harmony.contains(&want), "{want}");
    }
}

#[test]
fn pinned_date_is_printed_and_unpinned_is_today() {
    let refs = refs();
    let t = template(&refs);
    let msgs = serde_json::json!([{"role": "user", "content": "hi"}]);
    let out = t.render(&msgs, true, None).unwrap();
    assert!(out.contains("Current date: 2025-08-05\n"), "{out}");
    t.pin_now(Some(0));
    assert!(t
        .render(&msgs, true, None)
        .unwrap()
        .contains("Current date: 1970-01-01\n"));
    t.pin_now(None);
    let today = onebit_text::chat::strftime(
        "%Y-%m-%d",
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs() as i64,
    );
    assert!(t
        .render(&msgs, true, None)
        .unwrap()
        .contains(&format!("Current date: {today}\n")));
}
