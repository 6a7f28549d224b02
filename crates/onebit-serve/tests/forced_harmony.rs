//! A forced tool call (`tool_choice` required or named) on a harmony model
//! (gpt-oss) is written in harmony's own markup, on gpt-oss's real
//! vocabulary (o200k_harmony, from `scripts/fetch-models.sh`): the grammar
//! admits an optional `analysis` message and then exactly one call message
//! to an allowed function whose arguments fit that function's schema,
//! ended by `<|call|>`; and the reply it admits comes out of the harmony
//! splitter and the forced parse as that call with no content. The call
//! text is the harmony format's own example shape (openai-harmony's
//! `to=functions.NAME <|constrain|>json` header).

use onebit_formats::gguf::Gguf;
use onebit_serve::constrain::{Constrainer, Grammar};
use onebit_serve::harmony::HarmonySplitter;
use onebit_serve::tools::{self, ToolChoice, ToolSpec};
use onebit_text::Tokenizer;
use serde_json::json;

fn tokenizer() -> Tokenizer {
    let g = Gguf::open(onebit_testdata::real_model(onebit_testdata::O200K_HARMONY)).unwrap();
    Tokenizer::from_gguf(&g).unwrap()
}

fn spec(choice: ToolChoice) -> ToolSpec {
    ToolSpec {
        tools: vec![
            json!({"type": "function", "function": {"name": "get_weather", "parameters": {
                "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"],
                "additionalProperties": false}}}),
            json!({"type": "function", "function": {"name": "get_time", "parameters": {
                "type": "object", "properties": {"tz": {"type": "string"}}, "required": ["tz"],
                "additionalProperties": false}}}),
        ],
        choice,
        parallel: true,
    }
}

/// The constrainer of gpt-oss's vocabulary, ending a finished grammar with
/// `<|return|>` (built once: a trie over 200k tokens).
fn constrainer(tok: &Tokenizer) -> Constrainer {
    Constrainer::new(tok, tok.token_to_id("<|return|>").unwrap()).unwrap()
}

/// Whether the grammar admits `text` token by token, and then whether it
/// admits nothing but `<|call|>`.
fn admits(c: &Constrainer, tok: &Tokenizer, g: &Grammar, text: &str) -> (bool, bool) {
    let call = tok.token_to_id("<|call|>").unwrap();
    let mut k = c.compile(g).unwrap();
    let n = tok.vocab_size();
    for id in tok.encode(text, false).unwrap() {
        let mut logits = vec![0.0f32; n];
        k.mask(&mut logits).unwrap();
        if logits[id as usize] != 0.0 || k.commit(id).is_err() {
            return (false, false);
        }
    }
    let mut logits = vec![0.0f32; n];
    k.mask(&mut logits).unwrap();
    let left: Vec<usize> = (0..n).filter(|&i| logits[i] == 0.0).collect();
    (true, left == [call as usize])
}

fn grammar(tok: &Tokenizer, choice: ToolChoice) -> Grammar {
    let special = |s: &str| tok.token_to_id(s).filter(|&id| tok.is_special(id));
    tools::forced_grammar(&spec(choice), tools::forced(&tools::HARMONY), special)
}

const CALL: &str = "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\":\"Paris\"}";

#[test]
fn a_forced_harmony_reply_is_one_call_in_harmony_markup() {
    let tok = tokenizer();
    let c = constrainer(&tok);
    let required = grammar(&tok, ToolChoice::Required);
    let reasoned = format!(
        "<|channel|>analysis<|message|>The user wants the weather in Paris.<|end|><|start|>assistant{CALL}"
    );
    // The call, with or without reasoning first; then only <|call|>.
    assert_eq!(admits(&c, &tok, &required, CALL), (true, true));
    assert_eq!(admits(&c, &tok, &required, &reasoned), (true, true));
    let time =
        "<|channel|>commentary to=functions.get_time <|constrain|>json<|message|>{\"tz\":\"UTC\"}";
    assert_eq!(admits(&c, &tok, &required, time), (true, true));
    // Not admitted: a final answer instead of a call, an undeclared
    // function, arguments against the schema.
    for bad in [
        "<|channel|>final<|message|>It is sunny.",
        "<|channel|>commentary to=functions.book <|constrain|>json<|message|>{}",
        "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"town\":\"Paris\"}",
        "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\":3}",
    ] {
        assert!(!admits(&c, &tok, &required, bad).0, "{bad}");
    }
    // Named: only that function.
    let named = grammar(&tok, ToolChoice::Named("get_time".into()));
    assert!(admits(&c, &tok, &named, time).0);
    assert!(!admits(&c, &tok, &named, CALL).0);

    // What the grammar admits is the call, through the splitter and the
    // forced parse, with the reasoning apart and no content.
    let mut split = HarmonySplitter::new(true);
    let mut text = split.push(&reasoned);
    let rest = split.finish(false);
    text.reasoning.push_str(&rest.reasoning);
    text.content.push_str(&rest.content);
    assert_eq!(text.reasoning, "The user wants the weather in Paris.");
    let (content, calls) = tools::parse(&text.content, tools::forced(&tools::HARMONY));
    assert_eq!(content, "");
    assert_eq!(calls.len(), 1, "{calls:?}");
    assert_eq!(calls[0].name, "get_weather");
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&calls[0].arguments).unwrap(),
        json!({"city": "Paris"})
    );
}
