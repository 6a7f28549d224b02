//! `onebit import`: a GGUF file becomes a FastFlowLM pack directory
//! (model.q4nx, config.json, tokenizer.json, tokenizer_config.json,
//! generation_config.json); with `--mmproj`, its vision tower too
//! (vision_weights.q4nx, preprocessor_config.json, and config.json in HF's
//! multimodal form).

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, Result};
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use onebit_formats::gguf::Gguf;
use onebit_model::pack::{self, import as imp};
use onebit_text::{TextError, Tokenizer};
use serde_json::json;

#[derive(Args)]
pub struct ImportArgs {
    /// The .gguf file to convert.
    #[arg(long)]
    pub model: PathBuf,
    /// The pack directory to write (created if needed).
    #[arg(long)]
    pub out: PathBuf,
    /// The model's vision projector GGUF (llama.cpp's mmproj): its tower is
    /// written as FastFlowLM's converter writes it (vision_weights.q4nx).
    #[arg(long, value_name = "FILE")]
    pub mmproj: Option<PathBuf>,
    /// Keep Q8_0 matrices as Q8 tiles instead of re-quantizing them to the
    /// family's 4-bit type (more faithful; FastFlowLM's runtime reads only the latter).
    #[arg(long)]
    pub keep_q8: bool,
    /// The Q4 tile form: auto writes what FastFlowLM writes (16 x 128
    /// quarter tiles when the hidden size is off the 256-column grid, full
    /// 32 x 256 tiles otherwise; for gpt-oss its 32 x 128 half tiles);
    /// quarter, full and chunk4608 (the symmetric 4,608-byte chunk, Q4_0
    /// only) force one form (gpt-oss refuses them).
    #[arg(long, value_enum, default_value_t = TilesArg::Auto)]
    pub tiles: TilesArg,
}

/// `--tiles` values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum TilesArg {
    Auto,
    Quarter,
    Full,
    Chunk4608,
}

impl TilesArg {
    fn tiles(self) -> imp::Tiles {
        use onebit_formats::q4nx::TileForm;
        match self {
            TilesArg::Auto => imp::Tiles::Auto,
            TilesArg::Quarter => imp::Tiles::Force(TileForm::Quarter),
            TilesArg::Full => imp::Tiles::Force(TileForm::Full),
            TilesArg::Chunk4608 => imp::Tiles::Force(TileForm::Chunk4608),
        }
    }
}

pub fn import(a: ImportArgs) -> Result<()> {
    let t0 = Instant::now();
    // A split GGUF imports from its first part, as it loads.
    let g = Gguf::open_all(&a.model)?;
    let bar = ProgressBar::new(1);
    bar.set_style(
        ProgressStyle::with_template("[import] {bar:40} {pos}/{len} {msg}")
            .expect("valid template"),
    );
    // The projector is read and checked before the text model is converted.
    let mmproj = match &a.mmproj {
        Some(p) => {
            Some(Gguf::open(p).with_context(|| format!("cannot open --mmproj {}", p.display()))?)
        }
        None => None,
    };
    let mut imported = imp::import(
        &g,
        imp::ImportOptions {
            keep_q8: a.keep_q8,
            tiles: a.tiles.tiles(),
        },
        &mut |done, total, name| {
            bar.set_length(total as u64);
            bar.set_position(done as u64);
            bar.set_message(name.to_string());
        },
    )?;
    bar.finish_and_clear();
    for n in &imported.notes {
        eprintln!("[import] {n}");
    }
    let vision = match &mmproj {
        Some(m) => {
            let v = pack::vision::import(m, &imported.config)
                .with_context(|| format!("--mmproj {}", m.path().display()))?;
            for n in &v.notes {
                eprintln!("[import] {n}");
            }
            imported.config = v.config.clone();
            Some(v)
        }
        None => None,
    };
    imp::write(&a.out, &imported)?;
    if let Some(v) = &vision {
        pack::vision::write(&a.out, v)?;
    }
    write_tokenizer_files(&g, &a.out)?;
    let bytes: usize = imported.tensors.iter().map(|t| t.data.len()).sum::<usize>()
        + vision
            .iter()
            .flat_map(|v| v.tensors.iter())
            .map(|t| t.data.len())
            .sum::<usize>();
    eprintln!(
        "[import] {} -> {}: {} tensors, {:.1} MiB, in {:.1} s",
        a.model.display(),
        a.out.display(),
        imported.tensors.len() + vision.as_ref().map_or(0, |v| v.tensors.len()),
        bytes as f64 / (1 << 20) as f64,
        t0.elapsed().as_secs_f64()
    );
    Ok(())
}

fn write_json(path: &Path, v: &serde_json::Value) -> Result<()> {
    std::fs::write(path, serde_json::to_string_pretty(v)? + "\n")
        .with_context(|| format!("cannot write {}", path.display()))
}

/// tokenizer.json from our GGUF-built tokenizer (it encodes as llama.cpp
/// does), tokenizer_config.json with the BOS/EOS facts and the chat template,
/// generation_config.json with every id that ends generation.
fn write_tokenizer_files(g: &Gguf, dir: &Path) -> Result<()> {
    let tok = match Tokenizer::from_gguf(g) {
        Ok(t) => t,
        Err(TextError::NoVocabulary { .. }) => {
            eprintln!("[import] the GGUF has no vocabulary: no tokenizer files written (the pack runs on ids)");
            return Ok(());
        }
        Err(e) => return Err(e).context("cannot build the tokenizer to write tokenizer.json"),
    };
    let path = dir.join(pack::TOKENIZER);
    tok.inner()
        .save(&path, true)
        .map_err(|e| anyhow::anyhow!("{}: cannot write: {e}", path.display()))?;
    let sp = tok.special();
    let mut tc = json!({
        "add_bos_token": sp.add_bos,
        "add_eos_token": sp.add_eos,
        "tokenizer_class": "PreTrainedTokenizerFast",
    });
    if let Some(b) = &sp.bos_token {
        tc["bos_token"] = json!(b);
    }
    if let Some(e) = &sp.eos_token {
        tc["eos_token"] = json!(e);
    }
    if let Some(t) = g.str_opt("tokenizer.chat_template")? {
        tc["chat_template"] = json!(t);
    }
    write_json(&dir.join(pack::TOKENIZER_CONFIG), &tc)?;
    let mut gc = json!({ "eos_token_id": crate::open::stop_ids(&tok) });
    if let Some(b) = sp.bos {
        gc["bos_token_id"] = json!(b);
    }
    write_json(&dir.join(pack::GENERATION_CONFIG), &gc)
}
