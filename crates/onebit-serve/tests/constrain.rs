//! Constrained decoding on the real tokenizers (SmolLM2's byte-level BPE,
//! Gemma 3's SentencePiece): the token bytes llguidance sees are the bytes
//! each token decodes to, a grammar's mask admits exactly the tokens that
//! keep the text inside the grammar, and a finished grammar allows only the
//! stop token.

use onebit_formats::gguf::Gguf;
use onebit_serve::constrain::{token_bytes, Constrainer, Grammar};
use onebit_text::Tokenizer;
use serde_json::json;

fn tokenizer(model: &str) -> Tokenizer {
    let g = Gguf::open(onebit_testdata::real_model(model)).unwrap();
    Tokenizer::from_gguf(&g).unwrap()
}

fn both() -> [(&'static str, Tokenizer); 2] {
    [
        ("SmolLM2", tokenizer(onebit_testdata::SMOLLM2_135M)),
        ("Gemma 3", tokenizer(onebit_testdata::GEMMA3_270M)),
    ]
}

#[test]
fn token_bytes_are_what_each_token_decodes_to() {
    for (name, tok) in both() {
        let bytes = token_bytes(&tok);
        assert_eq!(bytes.len(), tok.vocab_size(), "{name}");
        // The text " Paris, {\"a\": 1}\n" encoded, then each token's bytes
        // joined: the same text back.
        let text = " Paris, {\"a\": 1}\n\u{e9}t\u{e9}";
        let ids = tok.encode(text, false).unwrap();
        let joined: Vec<u8> = ids
            .iter()
            .flat_map(|&i| bytes[i as usize].clone())
            .collect();
        assert_eq!(String::from_utf8(joined).unwrap(), text, "{name}: {ids:?}");
        // Control tokens carry llguidance's marker byte, so no text is one.
        let eos = tok.special().stop_ids()[0];
        assert_eq!(bytes[eos as usize][0], 0xFF, "{name}");
    }
}

#[test]
fn a_grammar_masks_to_its_continuations_then_to_the_stop_token() {
    for (name, tok) in both() {
        let eos = tok.special().stop_ids()[0];
        let c = Constrainer::new(&tok, eos).unwrap();
        let mut k = c
            .compile(&Grammar::Lark(r#"start: "yes" | "no""#.into()))
            .unwrap();
        let n = tok.vocab_size();
        let mut logits = vec![0.0f32; n];
        k.mask(&mut logits).unwrap();
        let allowed: Vec<u32> = (0..n as u32)
            .filter(|&i| logits[i as usize] == 0.0)
            .collect();
        // Every allowed token is a prefix of "yes" or "no", and the whole
        // words are among them when the vocabulary has them.
        for &i in &allowed {
            let t = tok.decode(&[i], false).unwrap();
            assert!(
                !t.is_empty() && ("yes".starts_with(&t) || "no".starts_with(&t)),
                "{name}: {t:?} allowed"
            );
        }
        let yes = tok.encode("yes", false).unwrap();
        assert!(allowed.contains(&yes[0]), "{name}");
        for &i in &yes {
            k.commit(i).unwrap();
        }
        let mut logits = vec![0.0f32; n];
        k.mask(&mut logits).unwrap();
        let left: Vec<usize> = (0..n).filter(|&i| logits[i] == 0.0).collect();
        assert_eq!(left, [eos as usize], "{name}");
    }
}

#[test]
fn a_strict_schema_with_an_unknown_keyword_is_refused_by_name() {
    let tok = tokenizer(onebit_testdata::SMOLLM2_135M);
    let c = Constrainer::new(&tok, tok.special().stop_ids()[0]).unwrap();
    let schema = json!({"type": "object", "properties": {"a": {"type": "string", "format": "no-such-format"}}, "x-guidance": {"lenient": false}});
    let e = c.compile(&Grammar::JsonSchema(schema)).err().unwrap();
    assert!(e.contains("no-such-format"), "{e}");
    let lenient = json!({"type": "object", "properties": {"a": {"type": "string", "format": "no-such-format"}}, "x-guidance": {"lenient": true}});
    assert!(c.compile(&Grammar::JsonSchema(lenient)).is_ok());
}

fn smollm_constrainer() -> (Tokenizer, Constrainer) {
    let tok = tokenizer(onebit_testdata::SMOLLM2_135M);
    let c = Constrainer::new(&tok, tok.special().stop_ids()[0]).unwrap();
    (tok, c)
}

/// Issue 31, item 5: a grammar that cannot produce anything, or one over
/// llguidance's limits, is refused when compiled (the request's 400), with
/// a one-line reason and none of llguidance's parser state; it used to
/// compile and fail at the first token, as a 500.
#[test]
fn unsatisfiable_and_oversized_grammars_are_refused_at_compile() {
    let (_, c) = smollm_constrainer();
    let alternation = format!(
        "start: {}\n",
        (0..20_000)
            .map(|i| format!("\"w{i}\""))
            .collect::<Vec<_>>()
            .join(" | ")
    );
    for (what, g) in [
        ("$ref #", Grammar::JsonSchema(json!({"$ref": "#"}))),
        (
            "no base case",
            Grammar::Lark("start: a\na: a \"x\"\n".into()),
        ),
        (
            "empty class",
            Grammar::Lark("start: /[^\\x00-\\U0010ffff]/\n".into()),
        ),
        ("20,000-way alternation", Grammar::Lark(alternation)),
    ] {
        let e = c
            .compile(&g)
            .err()
            .unwrap_or_else(|| panic!("{what}: compiled"));
        eprintln!("{what}: {e}");
        assert!(
            !e.is_empty() && !e.contains('\n') && e.len() < 400,
            "{what}: {e}"
        );
        assert!(
            !e.contains("NoExtensionBias") && !e.contains("tokens:"),
            "{what}: {e}"
        );
    }
    // Ordinary grammars still compile.
    assert!(c
        .compile(&Grammar::JsonSchema(json!({"type": "object"})))
        .is_ok());
    assert!(c.compile(&Grammar::Lark("start: \"a\"+\n".into())).is_ok());
}

/// The tokens the mask admits now.
fn admitted(k: &mut onebit_serve::constrain::Constraint, n: usize) -> Vec<u32> {
    let mut logits = vec![0.0f32; n];
    k.mask(&mut logits).unwrap();
    (0..n as u32)
        .filter(|&i| logits[i as usize] == 0.0)
        .collect()
}

fn commit_text(tok: &Tokenizer, k: &mut onebit_serve::constrain::Constraint, text: &str) {
    for id in tok.encode(text, false).unwrap() {
        k.commit(id).unwrap_or_else(|e| panic!("{text:?}: {e}"));
    }
}

/// Issue 31, item 7d: a schema's number takes at most 17 mantissa digits
/// (what an f64 carries), so it must end rather than run on to
/// max_tokens: after 17 the mask admits no digit and still admits the
/// closing brace; the 17th itself is admitted. Digits inside strings are
/// not counted.
#[test]
fn json_numbers_stop_at_seventeen_digits() {
    let (tok, c) = smollm_constrainer();
    let n = tok.vocab_size();
    let schema = json!({"type": "object", "properties": {"score": {"type": "number"}, "id": {"type": "string"}}, "required": ["score", "id"]});
    let digit = |t: &str| t.bytes().any(|b| b.is_ascii_digit());
    let text = |ids: &[u32]| {
        ids.iter()
            .map(|&i| tok.decode(&[i], false).unwrap())
            .collect::<Vec<_>>()
    };
    for (prefix, more) in [
        // 16 digits after "0.": one more is fine.
        ("{\"score\": 0.1234567890123456", true),
        // 17 after "0.": no 18th.
        ("{\"score\": 0.12345678901234567", false),
        // 17 in the integer part: no 18th, and no point either.
        ("{\"score\": 12345678901234567", false),
        ("{\"score\": -1234567890.1234567", false),
    ] {
        let mut k = c.compile(&Grammar::JsonSchema(schema.clone())).unwrap();
        commit_text(&tok, &mut k, prefix);
        let next = text(&admitted(&mut k, n));
        assert_eq!(next.iter().any(|t| digit(t)), more, "{prefix}: {next:?}");
        assert!(
            next.iter().any(|t| t.starts_with(',')),
            "{prefix}: {next:?}"
        );
        if !more {
            assert!(
                !next.iter().any(|t| t.starts_with('.')),
                "{prefix}: {next:?}"
            );
        }
    }
    // An exponent has up to 3 digits.
    let mut k = c.compile(&Grammar::JsonSchema(schema.clone())).unwrap();
    commit_text(&tok, &mut k, "{\"score\": 1e308");
    assert!(!text(&admitted(&mut k, n)).iter().any(|t| digit(t)));
    // Digits in a string run on.
    let mut k = c.compile(&Grammar::JsonSchema(schema)).unwrap();
    commit_text(
        &tok,
        &mut k,
        "{\"score\": 1, \"id\": \"12345678901234567890",
    );
    assert!(text(&admitted(&mut k, n)).iter().any(|t| digit(t)));
}

/// Issue 31, item 6: a Pydantic-style tool schema (`$defs` and
/// `#/$defs/X`, and `#` itself) compiles under a forced choice as it does
/// as `response_format`, and a call using the references is accepted.
#[test]
fn a_forced_call_resolves_the_tools_own_refs() {
    use onebit_serve::tools::{forced_grammar, ToolChoice, ToolSpec, HERMES};
    let (tok, c) = smollm_constrainer();
    let params = json!({
        "type": "object",
        "properties": {
            "guest": {"$ref": "#/$defs/Person"},
            "next": {"anyOf": [{"$ref": "#"}, {"type": "null"}]},
        },
        "required": ["guest", "next"],
        "$defs": {"Person": {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}},
    });
    assert!(c.compile(&Grammar::JsonSchema(params.clone())).is_ok());
    let tools = vec![
        json!({"type": "function", "function": {"name": "book", "parameters": params}}),
        json!({"type": "function", "function": {"name": "other", "parameters": {"type": "object", "properties": {"x": {"$ref": "#/$defs/X"}}, "$defs": {"X": {"type": "integer"}}}}}),
    ];
    for choice in [ToolChoice::Required, ToolChoice::Named("book".into())] {
        let spec = ToolSpec {
            tools: tools.clone(),
            choice: choice.clone(),
            parallel: false,
        };
        let g = forced_grammar(&spec, &HERMES, |_| None);
        let mut k = c.compile(&g).unwrap_or_else(|e| panic!("{choice:?}: {e}"));
        commit_text(
            &tok,
            &mut k,
            "<tool_call>\n{\"name\": \"book\", \"arguments\": {\"guest\": {\"name\": \"Ada\"}, \"next\": {\"guest\": {\"name\": \"Bo\"}, \"next\": null}}}\n</tool_call>",
        );
        let eos = tok.special().stop_ids()[0];
        assert_eq!(admitted(&mut k, tok.vocab_size()), [eos], "{choice:?}");
    }
}

/// Issue 31, item 5: a grammar that passes the arrival check but breaks a
/// limit two tokens in (a 20,000-way alternation after "qq") ends its
/// choice with `Finish::Constraint` ("constraint_error"), not a failure
/// (the 500 it used to be), on the engine with SmolLM2.
#[test]
fn a_constraint_failing_mid_decode_ends_the_choice_by_name() {
    use onebit_serve::engine::{Engine, EngineConfig, Event, Finish, GenParams, Job};

    use std::sync::Arc;
    let (tok, c) = smollm_constrainer();
    let alt: Vec<String> = (0..20_000).map(|i| format!("\"w{i}\"")).collect();
    let g = Grammar::Lark(format!("start: \"q\" \"q\" ({})\n", alt.join(" | ")));
    let k = c.compile(&g).expect("passes the arrival check");
    let path = onebit_testdata::real_model(onebit_testdata::SMOLLM2_135M);
    let exec = onebit_model::ExecConfig {
        threads: 1,
        ..onebit_model::ExecConfig::default()
    };
    let (model, _) = onebit_model::load::load(&path, &exec).unwrap();
    let e = Engine::start(
        model,
        tok.special().stop_ids(),
        EngineConfig {
            max_seqs: 1,
            max_queue: 4,
            prefill_chunk: 64,
            prefix_cache: false,
            cache_bytes: Some(1 << 20),
            spec: None,
            max_step: std::time::Duration::ZERO,
            fault: None,
            vision: None,
        },
        Arc::new(onebit_serve::metrics::Metrics::default()),
    );
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let job = Job {
        constraint: Some(k),
        ..Job::new(
            Arc::new(tok.encode("Say qq", false).unwrap()),
            GenParams::greedy(8),
            0,
            tx,
        )
    };
    assert!(e.submit(vec![job]).is_ok());
    let mut text = String::new();
    let finish = loop {
        match rx.blocking_recv().expect("the engine answers") {
            Event::Token { id, .. } => text.push_str(&tok.decode(&[id], false).unwrap()),
            Event::Done { finish, .. } => break finish,
            Event::Failed { message, .. } => panic!("failed: {message}"),
            Event::Started { .. } | Event::Encoded { .. } => {}
        }
    };
    assert_eq!(finish, Finish::Constraint, "{text:?}");
    assert_eq!(finish.as_str(), "constraint_error");
    assert!("qq".starts_with(text.as_str()), "{text:?}");
    e.shutdown();
}
