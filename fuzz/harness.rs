//! The fuzz harnesses: one function per target, each taking arbitrary bytes
//! and returning normally on any input. A panic, a hang or an unbounded
//! allocation is a bug. Shared by the cargo-fuzz targets
//! (`fuzz/fuzz_targets/*.rs`) and by the CI-cheap mutation test
//! (`crates/onebit/tests/fuzz_regress.rs`), which runs seeded mutations of
//! `fuzz/corpus/` and every file of `fuzz/regressions/` through them.

#![allow(dead_code)]

use onebit_formats::gguf::{self, writer::GgufWriter, Gguf, Value};
use onebit_formats::q4nx::{self, Q4Shape, Q8Shape, TileForm};
use onebit_formats::safetensors::{SafeTensors, StDtype};
use onebit_serve::api::{self, Endpoint, Limits};
use onebit_serve::constrain::{Constrainer, Grammar};
use onebit_serve::{prompt, tools};
use onebit_text::{ChatLimits, ChatTemplate, TemplateTokens, Tokenizer};

/// A harness: takes any bytes, returns normally.
pub type Harness = fn(&[u8]);

/// The targets by name, as `fuzz/corpus/<name>/` holds their seeds.
pub const TARGETS: &[(&str, Harness)] = &[
    ("gguf", gguf),
    ("safetensors", safetensors),
    ("tokenizer", tokenizer),
    ("chat_template", chat_template),
    ("request", request),
];

/// A GGUF image: parse; on success touch every tensor's bytes and metadata
/// value, derive the semantics, build the tokenizer and, when all of that
/// holds, load the weights and run one token.
pub fn gguf(data: &[u8]) {
    let Ok(g) = Gguf::from_bytes("fuzz.gguf", data) else {
        return;
    };
    let mut sum = 0u64;
    for t in &g.tensors {
        let b = g.tensor_bytes(t);
        assert_eq!(b.len() as u64, t.n_bytes);
        sum += b.first().copied().unwrap_or(0) as u64;
    }
    for (_, v) in &g.metadata {
        sum += gguf::describe(v).len() as u64;
    }
    std::hint::black_box(sum);
    let tok = Tokenizer::from_gguf(&g);
    if let Ok(t) = &tok {
        if let Ok(ids) = t.encode("Hello, world! <|im_start|> ünï 😀", true) {
            let _ = t.decode(&ids, false);
        }
    }
    let Ok(sem) = onebit_model::families::semantics_from_gguf(&g) else {
        return;
    };
    let _ = sem.lines();
    // Only small models go on to load and run (the fuzzer's seeds are tiny).
    if data.len() > 1 << 20 {
        return;
    }
    let opened = onebit_model::load::Opened {
        container: onebit_model::load::Container::Gguf(g),
        sem,
    };
    let exec = onebit_model::ExecConfig {
        threads: 1,
        max_context: 8,
        ..Default::default()
    };
    if let Ok(model) = opened.load(&exec) {
        let mut state = model.new_state();
        let n_vocab = model.sem.dims.n_vocab as u32;
        let _ = model.forward(
            &mut state,
            &[0, n_vocab.saturating_sub(1)],
            onebit_model::Logits::Last,
        );
    }
}

/// A safetensors image: parse; on success decode every I8 tensor as Q4 tiles
/// of each form (full, quarter, chunk) and as Q8 tiles, of the widths its
/// tile count allows.
pub fn safetensors(data: &[u8]) {
    let Ok(st) = SafeTensors::from_bytes("fuzz.q4nx", data) else {
        return;
    };
    for t in &st.tensors {
        let b = st.bytes(t);
        assert_eq!(b.len(), t.len);
        if !matches!(t.dtype, StDtype::I8 | StDtype::U8) || b.is_empty() {
            continue;
        }
        let _ = q4nx::tensor_kind(&b);
        for form in TileForm::ALL {
            let tiles = b.len() / form.bytes();
            let _ = q4nx::tensor_kind_of(form, &b);
            for rows_of_tiles in [1, tiles.max(1)] {
                let per_row = tiles / rows_of_tiles;
                let (n, k) = (form.rows() * rows_of_tiles, form.cols() * per_row.max(1));
                let Ok(shape) = Q4Shape::of(form, n, k) else {
                    continue;
                };
                let _ = q4nx::to_ggml(&b, shape);
                if form == TileForm::Full {
                    if let Ok(s8) = Q8Shape::new(32 * rows_of_tiles, 128 * per_row.max(1)) {
                        let _ = q4nx::q8_to_q8_0(&b, s8);
                    }
                }
                let mut row = vec![0f32; shape.kp()];
                let _ = q4nx::decode_row(&b, shape, 0, &mut row);
            }
        }
    }
}

/// Splits `data` at 0 bytes into up to `n` UTF-8 (lossy) parts.
fn parts(data: &[u8], n: usize) -> Vec<String> {
    data.splitn(n, |&b| b == 0)
        .map(|p| String::from_utf8_lossy(p).into_owned())
        .collect()
}

/// A GGUF vocabulary from fuzz bytes: the first byte picks the model
/// (`gpt2` byte-level BPE or `llama` SentencePiece) and flags, the next
/// parts separated by 0 bytes are tokens; merges pair neighbouring tokens;
/// the last part is the text to encode and decode.
pub fn tokenizer(data: &[u8]) {
    let Some((&flags, rest)) = data.split_first() else {
        return;
    };
    let mut p = parts(rest, 64);
    let text = p.pop().unwrap_or_default();
    let tokens: Vec<Value> = p.iter().map(|s| Value::Str(s.clone())).collect();
    let n = tokens.len() as u32;
    let mut w = GgufWriter::new();
    w.kv("general.architecture", Value::Str("llama".into()));
    let spm = flags & 1 == 1;
    w.kv(
        "tokenizer.ggml.model",
        Value::Str(if spm { "llama" } else { "gpt2" }.into()),
    );
    if flags & 2 != 0 {
        w.kv("tokenizer.ggml.pre", Value::Str("smollm".into()));
    }
    w.kv("tokenizer.ggml.tokens", Value::Array(tokens));
    if spm || flags & 4 != 0 {
        w.kv(
            "tokenizer.ggml.scores",
            Value::Array((0..n).map(|i| Value::F32(-(i as f32))).collect()),
        );
    }
    if flags & 8 != 0 {
        // Types cycle through normal, unknown, control, user-defined, unused, byte.
        w.kv(
            "tokenizer.ggml.token_type",
            Value::Array(
                (0..n)
                    .map(|i| Value::I32(1 + (i as i32 + flags as i32) % 6))
                    .collect(),
            ),
        );
    }
    if !spm {
        let merges: Vec<Value> = p
            .windows(2)
            .map(|w| Value::Str(format!("{} {}", w[0], w[1])))
            .collect();
        w.kv("tokenizer.ggml.merges", Value::Array(merges));
    }
    let id = |k: u8| (flags >> k) as u32 % (n + 2);
    w.kv("tokenizer.ggml.bos_token_id", Value::U32(id(4)));
    w.kv("tokenizer.ggml.eos_token_id", Value::U32(id(5)));
    if flags & 64 != 0 {
        w.kv("tokenizer.ggml.unknown_token_id", Value::U32(id(6)));
    }
    w.kv(
        "tokenizer.ggml.add_bos_token",
        Value::Bool(flags & 128 != 0),
    );
    let Ok(g) = Gguf::from_bytes("fuzz-vocab.gguf", &w.to_bytes()) else {
        return;
    };
    let Ok(t) = Tokenizer::from_gguf(&g) else {
        return;
    };
    for add in [false, true] {
        if let Ok(ids) = t.encode(&text, add) {
            let _ = t.decode(&ids, false);
            let _ = t.decode(&ids, true);
            let mut dec = onebit_text::StreamDecoder::new(&t);
            for &i in &ids {
                let _ = dec.push(i);
            }
            let _ = dec.finish();
        }
    }
    let _ = t.decode(&[n, n + 1, u32::MAX], false);
}

/// Output cap of the chat-template target: renderings must stay below it.
pub const CHAT_MAX_OUTPUT: usize = 1 << 16;

/// A template and a conversation from fuzz bytes: part 1 is the template,
/// part 2 the messages (alternating user/assistant, split at 0x01 bytes),
/// part 3 (optional) a JSON object of extra keyword arguments.
pub fn chat_template(data: &[u8]) {
    let p = parts(data, 3);
    let source = &p[0];
    let limits = ChatLimits {
        max_output_bytes: CHAT_MAX_OUTPUT,
        fuel: 200_000,
    };
    let tokens = TemplateTokens {
        bos_token: Some("<s>".into()),
        eos_token: Some("</s>".into()),
        ..Default::default()
    };
    let Ok(t) = ChatTemplate::with_limits(source, tokens, limits) else {
        return;
    };
    let contents = p.get(1).map_or("", String::as_str);
    let messages: Vec<serde_json::Value> = contents
        .split('\u{1}')
        .enumerate()
        .map(|(i, c)| {
            let role = ["system", "user", "assistant", "tool"][i % 4];
            serde_json::json!({"role": role, "content": c})
        })
        .collect();
    let extra = p
        .get(2)
        .and_then(|s| serde_json::from_str::<serde_json::Value>(s).ok())
        .and_then(|v| v.as_object().cloned());
    for gen in [true, false] {
        if let Ok(out) = t.render(
            &serde_json::Value::Array(messages.clone()),
            gen,
            extra.as_ref(),
        ) {
            assert!(out.len() <= CHAT_MAX_OUTPUT, "rendered {} bytes", out.len());
        }
    }
}

/// A request body for either endpoint (the first byte picks).
pub fn request(data: &[u8]) {
    let Some((&which, body)) = data.split_first() else {
        return;
    };
    let ep = if which & 1 == 0 {
        Endpoint::Chat
    } else {
        Endpoint::Completions
    };
    let limits = Limits {
        max_n: 8,
        max_tokens: 0,
        drafting: true,
    };
    if let Ok(r) = api::parse(body, ep, limits) {
        assert!(r.n >= 1 && r.n <= limits.max_n, "n = {}", r.n);
        assert!(r.stop.len() <= api::MAX_STOPS);
        assert!(r.max_tokens.is_none_or(|m| m >= 1));
        arrive(&r);
    }
}

/// What a request meets on arrival beyond parsing (issue 31: the tool
/// history and the constraints): built once for the target.
struct Arrival {
    tok: Tokenizer,
    /// A ChatML template that writes tools and tool calls itself.
    with_tools: ChatTemplate,
    /// One that knows no tools: the generic fallback renders them.
    plain: ChatTemplate,
    constrainer: Constrainer,
}

fn arrival() -> &'static Arrival {
    static A: std::sync::OnceLock<Arrival> = std::sync::OnceLock::new();
    A.get_or_init(|| {
        let g = Gguf::from_bytes(
            "tiny-llama.gguf",
            include_bytes!("corpus/gguf/tiny-llama.gguf"),
        )
        .expect("the seed model parses");
        let tok = Tokenizer::from_gguf(&g).expect("the seed model has a tokenizer");
        let t = |src: &str| {
            ChatTemplate::with_limits(
                src,
                TemplateTokens::from_tokenizer(&tok),
                ChatLimits {
                    max_output_bytes: CHAT_MAX_OUTPUT,
                    fuel: 200_000,
                },
            )
            .expect("the harness's templates compile")
        };
        let with_tools = t(include_str!(
            "../testdata/chat-templates/chatml-think-tools.jinja"
        ));
        let plain = t("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}<|im_start|>assistant\n");
        let constrainer = Constrainer::new(&tok, 2).expect("a constrainer over the seed vocabulary");
        Arrival {
            tok,
            with_tools,
            plain,
            constrainer,
        }
    })
}

/// The server's arrival path for a parsed request, on the harness's model:
/// the tool history made objects or folded into the generic fallback, the
/// rendering with user strings marked plain and its tokens, the forced
/// call's grammar, and every constraint compiled. Errors are answers; only
/// a panic (or a hang) is a bug.
fn arrive(r: &api::Request) {
    let a = arrival();
    let mut grammars: Vec<Grammar> = r.grammar.iter().cloned().collect();
    if let api::Prompt::Chat(messages) = &r.prompt {
        let spec = r.tools.as_ref();
        // The template's own tool format.
        let mut kwargs = r.template_kwargs.clone();
        if let Some(spec) = spec.filter(|s| s.parsed()) {
            kwargs
                .get_or_insert_with(Default::default)
                .insert("tools".into(), serde_json::Value::Array(spec.tools.clone()));
        }
        let own = tools::arguments_as_objects(messages);
        // The generic fallback.
        let folded = tools::merge_adjacent_users(tools::fallback_messages(messages, spec));
        for (t, m, kw) in [
            (&a.with_tools, &own, kwargs.as_ref()),
            (&a.plain, &folded, r.template_kwargs.as_ref()),
        ] {
            if let Ok(rendered) = prompt::render(t, m, kw, true) {
                let _ = prompt::ids(&a.tok, &rendered, m, false);
            }
        }
        if let Some(spec) = spec.filter(|s| s.parsed() && s.forced()) {
            let special = |s: &str| a.tok.token_to_id(s).filter(|&id| a.tok.is_special(id));
            for f in [tools::detect(a.with_tools.source()), Some(&tools::GENERIC)]
                .into_iter()
                .flatten()
            {
                grammars.push(tools::forced_grammar(spec, tools::forced(f), special));
            }
        }
    }
    for g in &grammars {
        if let Ok(mut c) = a.constrainer.compile(g) {
            let mut logits = vec![0f32; a.tok.vocab_size()];
            if c.mask(&mut logits).is_ok() {
                if let Some(id) = logits.iter().position(|l| l.is_finite()) {
                    let _ = c.commit(id as u32);
                }
            }
        }
    }
}
