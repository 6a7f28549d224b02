//! Chat templates rendered exactly as transformers renders them: SmolLM2's own
//! template (strings from transformers' `apply_chat_template`), and templates
//! exercising what HF templates lean on (strings from Python `jinja2` set up as
//! transformers sets it up; `scripts/gen_chat_refs.py` made them).

use onebit_text::{ChatError, ChatTemplate, TemplateTokens};
use serde_json::Value;

fn load(name: &str) -> Value {
    let p = onebit_testdata::dir().join("refs").join(name);
    let text = std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    serde_json::from_str(&text).unwrap()
}

fn tokens(v: &Value) -> TemplateTokens {
    let s = |k: &str| v[k].as_str().map(str::to_string);
    TemplateTokens {
        bos_token: s("bos_token"),
        eos_token: s("eos_token"),
        unk_token: s("unk_token"),
        pad_token: s("pad_token"),
    }
}

#[test]
fn smollm2_template_renders_as_transformers() {
    let refs = load("chat-SmolLM2-135M-Instruct.Q4_1.json");
    let t = ChatTemplate::new(
        refs["template"].as_str().unwrap(),
        TemplateTokens {
            bos_token: Some("<|im_start|>".into()),
            eos_token: Some("<|im_end|>".into()),
            ..Default::default()
        },
    )
    .unwrap();
    let cases = refs["cases"].as_array().unwrap();
    assert!(cases.len() >= 6);
    for c in cases {
        let got = t
            .render(
                &c["messages"],
                c["add_generation_prompt"].as_bool().unwrap(),
                None,
            )
            .unwrap();
        assert_eq!(got, c["rendered"].as_str().unwrap(), "case {c}");
    }
}

#[test]
fn templates_render_as_jinja2_set_up_as_transformers() {
    let refs = load("chat-templates.json");
    let toks = tokens(&refs["special_tokens"]);
    let dir = onebit_testdata::dir().join("chat-templates");
    let mut n = 0;
    for c in refs["cases"].as_array().unwrap() {
        let name = c["template"].as_str().unwrap();
        let src = std::fs::read_to_string(dir.join(name)).unwrap();
        let t = ChatTemplate::new(&src, toks.clone()).unwrap_or_else(|e| panic!("{name}: {e}"));
        let got = t.render(
            &c["messages"],
            c["add_generation_prompt"].as_bool().unwrap(),
            c["extra"].as_object(),
        );
        let what = format!("{name} / {} / {}", c["conversation"], c["extra"]);
        match (got, c.get("rendered"), c.get("error")) {
            (Ok(got), Some(want), _) => assert_eq!(got, want.as_str().unwrap(), "{what}"),
            (Err(ChatError::Raised(msg)), _, Some(want)) => {
                assert_eq!(msg, want.as_str().unwrap(), "{what}")
            }
            (got, _, _) => panic!("{what}: got {got:?}, want {c}"),
        }
        n += 1;
    }
    assert!(n >= 50, "only {n} cases");
}
