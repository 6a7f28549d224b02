//! A model path as the commands use it: the runnable model, its tokenizer,
//! chat template and stop rules, whichever container they come from.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use indicatif::{ProgressBar, ProgressStyle};
use onebit_model::forward::context_limit;
use onebit_model::load::{self, Container, Opened};
use onebit_model::pack::{self, Pack, TokenRef};
use onebit_model::{ExecConfig, Model};
use onebit_text::{ChatLimits, ChatTemplate, SpecialTokens, TemplateTokens, Tokenizer};

pub struct Loaded {
    pub model: Model,
    pub opened: Opened,
}

/// Opens and loads a model, printing its load time (the `[semantics]`
/// block is [`print_semantics`]'s, for `-v`).
pub fn load_model(path: &Path, exec: &ExecConfig) -> Result<Loaded> {
    let t = Instant::now();
    // While the file opens, a spinner; while the weights are prepared (the
    // long part), a bar of the prepared bytes. Only when stderr is a
    // terminal: indicatif draws nothing otherwise, so logs get only the
    // `[load]` line.
    let bar = ProgressBar::new(0);
    if !bar.is_hidden() {
        bar.set_style(
            ProgressStyle::with_template("[load] {spinner} {msg} {elapsed}")
                .expect("valid template"),
        );
        let name = path.file_name().unwrap_or(path.as_os_str());
        bar.set_message(name.to_string_lossy().into_owned());
        bar.enable_steady_tick(Duration::from_millis(120));
    }
    let mut progress = |done: u64, total: u64| {
        if bar.is_hidden() || total == 0 {
            return;
        }
        if bar.length() != Some(total) {
            bar.set_length(total);
            bar.set_style(
                ProgressStyle::with_template(
                    "[load] {msg} preparing weights [{bar:30}] {bytes}/{total_bytes} {elapsed}",
                )
                .expect("valid template")
                .progress_chars("=> "),
            );
        }
        bar.set_position(done);
    };
    let loaded =
        load::open(path).and_then(|o| o.load_reporting(exec, &mut progress).map(|m| (o, m)));
    bar.finish_and_clear();
    let (opened, model) = loaded?;
    eprintln!(
        "[load] {} in {:.2} s, {} threads, {} KV cache",
        path.display(),
        t.elapsed().as_secs_f64(),
        model.threads(),
        model.kv_type()
    );
    Ok(Loaded { model, opened })
}

/// Writes the `[semantics]` lines of a run with `exec` to stderr when
/// `verbose` (`-v`).
pub fn print_semantics(opened: &Opened, exec: &ExecConfig, verbose: bool) {
    if verbose {
        for l in semantics_lines(opened, exec) {
            eprintln!("[semantics] {l}");
        }
    }
}

/// The `[semantics]` lines of a run with `exec`: the model's rules (with
/// the tables this run's context selects), and for a pack the BOS/EOS facts
/// with the file and key each came from.
pub fn semantics_lines(opened: &Opened, exec: &ExecConfig) -> Vec<String> {
    let mut v = opened
        .sem
        .at_context(context_limit(exec, &opened.sem))
        .lines();
    if let Container::Pack(p) = &opened.container {
        let f = p.special_facts();
        let show = |t: &Option<TokenRef>| match t {
            Some(TokenRef::Id(i)) => format!("id {i}"),
            Some(TokenRef::Text(s)) => format!("{s:?}"),
            None => "none".into(),
        };
        v.push(format!("bos: {}  <- {}", show(&f.bos.value), f.bos.source));
        v.push(format!(
            "add bos: {}  <- {}",
            f.add_bos.value.map_or(
                "not stated (tokenizer.json post-processor decides)".into(),
                |b| b.to_string()
            ),
            f.add_bos.source
        ));
        let eos: Vec<String> = f.eos.value.iter().map(|t| show(&Some(t.clone()))).collect();
        v.push(format!("eos: [{}]  <- {}", eos.join(", "), f.eos.source));
    }
    v
}

/// The tokenizer a container carries.
pub fn tokenizer(opened: &Opened) -> Result<Tokenizer> {
    match &opened.container {
        Container::Gguf(g) => Tokenizer::from_gguf(g)
            .with_context(|| format!("{}: cannot build the tokenizer", g.path().display())),
        Container::Pack(p) => pack_tokenizer(p),
    }
}

/// A pack's tokenizer: tokenizer.json, with the BOS/EOS facts its JSON files
/// state (config.json first, then tokenizer_config.json; every eos id of
/// config.json and generation_config.json).
fn pack_tokenizer(p: &Pack) -> Result<Tokenizer> {
    let path = p.dir().join(pack::TOKENIZER);
    let inner = tokenizers::Tokenizer::from_file(&path)
        .map_err(|e| anyhow::anyhow!("{}: cannot read the tokenizer: {e}", path.display()))?;
    let facts = p.special_facts();
    let resolve = |t: &TokenRef, what: &str| -> Result<u32> {
        match t {
            TokenRef::Id(i) => Ok(*i),
            TokenRef::Text(s) => inner.token_to_id(s).ok_or_else(|| {
                anyhow::anyhow!(
                    "{}: {what} {s:?} is not a token of {}",
                    p.dir().display(),
                    path.display()
                )
            }),
        }
    };
    let bos = facts
        .bos
        .value
        .as_ref()
        .map(|t| resolve(t, &facts.bos.source))
        .transpose()?;
    let add_bos = match facts.add_bos.value {
        Some(b) => b,
        // Not stated: whether tokenizer.json's post-processor adds it.
        None => bos.is_some_and(|b| {
            inner
                .encode("", true)
                .is_ok_and(|e| e.get_ids().first() == Some(&b))
        }),
    };
    let eos = facts
        .eos
        .value
        .iter()
        .map(|t| resolve(t, "eos token"))
        .collect::<Result<Vec<u32>>>()?;
    let eot = [
        "<|eot_id|>",
        "<|im_end|>",
        "<|end|>",
        "<end_of_turn>",
        "<|endoftext|>",
    ]
    .iter()
    .find_map(|n| inner.token_to_id(n));
    let mut eog = eos.clone();
    eog.extend(eot);
    let special = SpecialTokens {
        bos,
        bos_token: bos.and_then(|b| inner.id_to_token(b)),
        eos_token: eos.first().and_then(|&e| inner.id_to_token(e)),
        eos,
        add_bos,
        add_eos: false,
        unk: None,
        pad: None,
        eot,
        eom: None,
        eog,
    };
    Ok(Tokenizer::from_parts(inner, special))
}

/// Every end-of-generation id the tokenizer knows (EOS, EOT, turn ends).
pub fn stop_ids(tok: &Tokenizer) -> Vec<u32> {
    let mut s = tok.special().stop_ids();
    for name in ["<end_of_turn>", "<|im_end|>", "<|eot_id|>", "<|endoftext|>"] {
        if let Some(id) = tok.token_to_id(name) {
            s.push(id);
        }
    }
    s.sort_unstable();
    s.dedup();
    s
}

/// The chat template a container carries and where it came from: a pack's
/// `chat_template.jinja`, else its `tokenizer_config.json` `chat_template`; a
/// GGUF file's `tokenizer.chat_template`. None when the model states none.
pub fn chat_template(opened: &Opened) -> Option<(String, String)> {
    match &opened.container {
        Container::Gguf(g) => g
            .get("tokenizer.chat_template")
            .and_then(|v| v.as_str())
            .map(|t| (t.to_string(), "GGUF tokenizer.chat_template".into())),
        Container::Pack(p) => p.chat_template(),
    }
}

/// The known chat template of the model's family (a table in its family
/// file), for a model that carries none, and where it comes from; prints
/// the `[semantics]` line naming that source.
pub fn family_chat_template(opened: &Opened) -> Option<(String, String)> {
    let t = onebit_model::families::known_chat_template(opened.sem.family)?;
    eprintln!(
        "[semantics] chat template: the model carries none; using its family's  <- {}",
        t.source
    );
    Some((t.value.to_string(), t.source))
}

/// The compiled chat template: `file` when given, else the model's own,
/// else its family's known one. None when none exists (chat is then
/// refused by whoever needs it).
pub fn load_chat_template(
    opened: &Opened,
    tok: &Tokenizer,
    file: Option<&Path>,
) -> Result<Option<(ChatTemplate, String)>> {
    load_chat_template_with(opened, tok, file, ChatLimits::default())
}

/// As [`load_chat_template`], rendering within `limits`.
pub fn load_chat_template_with(
    opened: &Opened,
    tok: &Tokenizer,
    file: Option<&Path>,
    limits: ChatLimits,
) -> Result<Option<(ChatTemplate, String)>> {
    let (src, from) = match file {
        Some(f) => (
            std::fs::read_to_string(f)
                .with_context(|| format!("cannot read the chat template {}", f.display()))?,
            f.display().to_string(),
        ),
        None => match chat_template(opened).or_else(|| family_chat_template(opened)) {
            Some(t) => t,
            None => return Ok(None),
        },
    };
    let t = ChatTemplate::with_limits(&src, TemplateTokens::from_tokenizer(tok), limits)
        .with_context(|| format!("chat template from {from}"))?;
    Ok(Some((t, from)))
}

/// How the model's embeddings pool: GGUF `<arch>.pooling_type`, mean when a
/// GGUF file or a pack declares none; an error names a value not implemented.
pub fn pooling(opened: &Opened) -> Result<onebit_serve::embed::Pooling, String> {
    match &opened.container {
        Container::Gguf(g) => {
            let arch = g
                .get("general.architecture")
                .and_then(|v| v.as_str())
                .unwrap_or("general");
            let key = format!("{arch}.pooling_type");
            onebit_serve::embed::Pooling::from_gguf(g.get(&key).and_then(|v| v.as_i64()), &key)
        }
        Container::Pack(p) => onebit_serve::embed::Pooling::from_gguf(
            None,
            &format!("pack {} (no pooling declared)", p.dir().display()),
        ),
    }
}

/// Ollama's `quantization_level`: the file's declared `general.file_type`,
/// named as llama.cpp names it (15 is Q4_K_M, though its most bytes may
/// be another type); a value llama.cpp does not define is said as such; a
/// file that declares none, the weight type holding most bytes.
fn quantization_level(
    g: &onebit_formats::gguf::Gguf,
    by_type: &std::collections::BTreeMap<&str, u64>,
) -> String {
    use onebit_formats::gguf::ftype::{file_type_name, FILE_TYPE_KEY};
    match g.get(FILE_TYPE_KEY).and_then(|v| v.as_i64()) {
        Some(v) => u32::try_from(v)
            .ok()
            .and_then(file_type_name)
            .map_or_else(|| format!("unknown ({FILE_TYPE_KEY} {v})"), str::to_string),
        None => by_type
            .iter()
            .max_by_key(|(_, b)| **b)
            .map_or(String::new(), |(t, _)| t.to_string()),
    }
}

/// What Ollama's `/api/tags` and `/api/show` say about the model.
pub fn about(opened: &Opened, path: &Path) -> onebit_serve::ModelAbout {
    match &opened.container {
        Container::Gguf(g) => {
            let mut by_type: std::collections::BTreeMap<&str, u64> = Default::default();
            for t in &g.tensors {
                *by_type.entry(t.dtype.name()).or_default() += t.n_bytes;
            }
            onebit_serve::ModelAbout {
                arch: g
                    .get("general.architecture")
                    .and_then(|v| v.as_str())
                    .unwrap_or("")
                    .to_string(),
                format: "gguf".into(),
                bytes: std::fs::metadata(path).map_or(0, |m| m.len()),
                quantization: quantization_level(g, &by_type),
                parameters: g.tensors.iter().map(|t| t.n_elements()).sum(),
            }
        }
        Container::Pack(p) => onebit_serve::ModelAbout {
            arch: p.family.arch.to_string(),
            format: "fastflowlm".into(),
            bytes: std::fs::read_dir(p.dir()).map_or(0, |d| {
                d.filter_map(|e| e.ok()?.metadata().ok())
                    .map(|m| m.len())
                    .sum()
            }),
            quantization: "Q4NX".into(),
            parameters: p
                .tensors
                .iter()
                .map(|t| t.stored_shape.iter().product::<u64>())
                .sum(),
        },
    }
}
