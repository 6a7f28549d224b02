//! What a model declares, whichever container holds the declaration.
//!
//! A GGUF file says `gemma3.rope.freq_base_swa`; a pack's config.json says
//! `rope_local_base_freq`. Family files ask for the logical key (`ROPE_BASE_SWA`)
//! and get the value with its source spelled as the container spells it, so
//! one family file serves both containers and differs by container only where
//! the containers really store different things (stored +1 norms, permuted
//! q/k rows, pre-scaled embeddings).

use std::path::{Path, PathBuf};

use onebit_formats::gguf::{Gguf, Value};
use serde_json::Value as Json;

use crate::error::{ModelError, Result};

/// The largest size (width, head count, head dim, vocabulary, ...) a model
/// may declare: 2^20, above every released model's (vocabularies reach 2^18).
pub const MAX_SIZE: usize = 1 << 20;

/// Which kind of container a declaration came from (the opened container
/// itself, with its data, is `load::Container`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ContainerKind {
    Gguf,
    /// A FastFlowLM pack: model.q4nx with HF config.json and tokenizer files.
    Pack,
}

/// A logical key: its GGUF spelling (after `<arch>.`) and its config.json
/// spellings, first match wins. An empty spelling: not declared there.
#[derive(Clone, Copy, Debug)]
pub struct Key {
    pub gguf: &'static str,
    pub hf: &'static [&'static str],
}

/// A key table: `NAME = "gguf suffix", ["config.json path", ...];` ('/'
/// descends into objects). The table below holds the keys several families
/// read; a family's own keys are declared in its own file with this macro.
macro_rules! keys {
    ($($name:ident = $gguf:literal, [$($hf:literal),*];)*) => {
        $(pub const $name: $crate::families::decls::Key =
            $crate::families::decls::Key { gguf: $gguf, hf: &[$($hf),*] };)*
    };
}
pub(crate) use keys;

// The shared table: logical key = GGUF suffix, [config.json paths].
keys! {
    N_EMBD = "embedding_length", ["hidden_size"];
    N_LAYER = "block_count", ["num_hidden_layers"];
    N_HEAD = "attention.head_count", ["num_attention_heads"];
    N_HEAD_KV = "attention.head_count_kv", ["num_key_value_heads"];
    HEAD_DIM_K = "attention.key_length", ["head_dim"];
    HEAD_DIM_V = "attention.value_length", ["head_dim"];
    N_FF = "feed_forward_length", ["intermediate_size", "block_ff_dim"];
    N_VOCAB = "vocab_size", ["vocab_size"];
    N_CTX_TRAIN = "context_length", ["max_position_embeddings"];
    NORM_EPS = "attention.layer_norm_rms_epsilon", ["rms_norm_eps", "norm_eps"];
    ROPE_BASE = "rope.freq_base", ["rope_theta", "rope_parameters/rope_theta"];
    ROPE_DIMS = "rope.dimension_count", [];
    ROPE_SCALING_TYPE = "rope.scaling.type", ["rope_scaling/rope_type", "rope_scaling/type"];
    ROPE_SCALING_FACTOR = "rope.scaling.factor", ["rope_scaling/factor"];
    ROPE_SCALE_LINEAR = "rope.scale_linear", [];
    SLIDING_WINDOW = "attention.sliding_window", ["sliding_window"];
    SLIDING_WINDOW_PATTERN = "attention.sliding_window_pattern", ["sliding_window_pattern"];
    LAYER_TYPES = "", ["layer_types"];
    FINAL_SOFTCAP = "final_logit_softcapping", ["final_logit_softcapping"];
    USE_QK_NORM = "", ["use_qk_norm"];
    // Routed experts (families/moe.rs reads them).
    EXPERT_COUNT = "expert_count", ["num_experts", "num_local_experts", "n_routed_experts"];
    EXPERT_USED_COUNT = "expert_used_count", ["num_experts_per_tok"];
    EXPERT_FF = "expert_feed_forward_length", ["moe_intermediate_size"];
    EXPERT_SHARED_COUNT = "expert_shared_count", ["n_shared_experts", "num_shared_experts"];
    EXPERT_SHARED_FF = "expert_shared_feed_forward_length", ["shared_expert_intermediate_size"];
    EXPERT_WEIGHTS_NORM = "expert_weights_norm", ["norm_topk_prob"];
    EXPERT_WEIGHTS_SCALE = "expert_weights_scale", ["routed_scaling_factor"];
    EXPERT_GATING_FUNC = "expert_gating_func", ["scoring_func"];
    EXPERT_GROUP_COUNT = "expert_group_count", ["n_group"];
    EXPERT_SELECTION_BIAS = "", ["use_expert_bias"];
    LEADING_DENSE = "leading_dense_block_count", ["first_k_dense_replace", "num_dense_layers"];
}

enum Source<'a> {
    Gguf(&'a Gguf),
    Config(&'a Json),
    Stated(&'a [Stated]),
}

/// One key another container's declarations were translated into: the
/// GGUF spelling a reader asks for (`clip.vision.image_size`), its value,
/// and where the value was read (a pack's vision tower states its keys in
/// config.json's `vision_config`, in `preprocessor_config.json`, or not at
/// all, where a stated default applies).
#[derive(Clone, Debug, PartialEq)]
pub struct Stated {
    /// The full GGUF key, `<arch>.<suffix>`.
    pub key: String,
    pub value: Json,
    /// The key as its container spells it (`vision_config.hidden_size`).
    pub spelled: String,
    /// Where the value comes from, for `[semantics]` lines.
    pub source: String,
}

/// The declarations of one model.
pub struct Decls<'a> {
    pub container: ContainerKind,
    /// The GGUF architecture prefix of the family reading these declarations.
    pub arch: &'static str,
    path: PathBuf,
    source: Source<'a>,
    tensors: &'a dyn Fn(&str) -> Option<Vec<u64>>,
}

impl<'a> Decls<'a> {
    pub fn gguf(
        g: &'a Gguf,
        arch: &'static str,
        tensors: &'a dyn Fn(&str) -> Option<Vec<u64>>,
    ) -> Decls<'a> {
        Decls {
            container: ContainerKind::Gguf,
            arch,
            path: g.path().to_path_buf(),
            source: Source::Gguf(g),
            tensors,
        }
    }

    /// `config` is config.json (its `text_config` when the model nests one);
    /// `tensors` gives a tensor's ggml dims by GGUF tensor name.
    pub fn config(
        config: &'a Json,
        path: &Path,
        arch: &'static str,
        tensors: &'a dyn Fn(&str) -> Option<Vec<u64>>,
    ) -> Decls<'a> {
        Decls {
            container: ContainerKind::Pack,
            arch,
            path: path.to_path_buf(),
            source: Source::Config(config),
            tensors,
        }
    }

    /// Declarations translated from another container ([`Stated`]), read
    /// by the GGUF spelling of each key; `path` is the file errors name.
    pub fn stated(
        stated: &'a [Stated],
        path: &Path,
        arch: &'static str,
        tensors: &'a dyn Fn(&str) -> Option<Vec<u64>>,
    ) -> Decls<'a> {
        Decls {
            container: ContainerKind::Pack,
            arch,
            path: path.to_path_buf(),
            source: Source::Stated(stated),
            tensors,
        }
    }

    fn stated_entry(&self, k: Key) -> Option<&Stated> {
        match &self.source {
            Source::Stated(s) if !k.gguf.is_empty() => {
                let key = format!("{}.{}", self.arch, k.gguf);
                s.iter().find(|e| e.key == key)
            }
            _ => None,
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whether the container holds a tensor (GGUF name, e.g. `blk.0.attn_q_norm.weight`).
    pub fn has_tensor(&self, name: &str) -> bool {
        (self.tensors)(name).is_some()
    }

    /// A tensor's dims in ggml order (GGUF name), when the container holds it.
    pub fn tensor_dims(&self, name: &str) -> Option<Vec<u64>> {
        (self.tensors)(name)
    }

    /// The key as this container spells it (first spelling when none is present).
    pub fn spelled(&self, k: Key) -> String {
        match &self.source {
            Source::Gguf(_) => format!("{}.{}", self.arch, k.gguf),
            Source::Config(cfg) => {
                k.hf.iter()
                    .find(|p| lookup(cfg, p).is_some())
                    .or(k.hf.first())
                    .map(|p| p.replace('/', "."))
                    .unwrap_or_default()
            }
            Source::Stated(_) => self
                .stated_entry(k)
                .map(|e| e.spelled.clone())
                .unwrap_or_else(|| format!("{}.{}", self.arch, k.gguf)),
        }
    }

    /// "GGUF gemma3.rope.freq_base_swa" / "config.json rope_local_base_freq".
    pub fn src(&self, k: Key) -> String {
        if let Source::Stated(_) = self.source {
            return match self.stated_entry(k) {
                Some(e) => e.source.clone(),
                None => format!("not stated ({})", self.spelled(k)),
            };
        }
        match self.container {
            ContainerKind::Gguf => format!("GGUF {}", self.spelled(k)),
            ContainerKind::Pack => format!("config.json {}", self.spelled(k)),
        }
    }

    /// The declared value, or None when this container does not state it.
    /// A JSON `null` states nothing.
    pub fn get(&self, k: Key) -> Option<Json> {
        match &self.source {
            Source::Gguf(g) if !k.gguf.is_empty() => {
                g.get(&format!("{}.{}", self.arch, k.gguf)).map(to_json)
            }
            Source::Gguf(_) => None,
            Source::Config(cfg) => {
                k.hf.iter()
                    .find_map(|p| lookup(cfg, p))
                    .filter(|v| !v.is_null())
                    .cloned()
            }
            Source::Stated(_) => self
                .stated_entry(k)
                .map(|e| e.value.clone())
                .filter(|v| !v.is_null()),
        }
    }

    pub fn err(&self, k: Key, what: impl Into<String>) -> ModelError {
        ModelError::Key {
            path: self.path.clone(),
            key: self.spelled(k),
            what: what.into(),
        }
    }

    pub fn f64_opt(&self, k: Key) -> Result<Option<f64>> {
        match self.get(k) {
            None => Ok(None),
            Some(v) => v
                .as_f64()
                .map(Some)
                .ok_or_else(|| self.err(k, format!("expected a number, found {v}"))),
        }
    }

    pub fn usize_opt(&self, k: Key) -> Result<Option<usize>> {
        match self.get(k) {
            None => Ok(None),
            Some(v) => v
                .as_u64()
                .map(|x| Some(x as usize))
                .ok_or_else(|| self.err(k, format!("expected a non-negative integer, found {v}"))),
        }
    }

    pub fn usize(&self, k: Key) -> Result<usize> {
        self.usize_opt(k)?
            .ok_or_else(|| self.err(k, "is required but absent"))
    }

    /// A required positive integer: a size, at most [`MAX_SIZE`].
    pub fn positive(&self, k: Key) -> Result<usize> {
        match self.usize(k)? {
            0 => Err(self.err(k, "must be positive, found 0")),
            v => self.size_checked(k, v),
        }
    }

    /// `v`, when it is at most [`MAX_SIZE`]; else an error naming the key.
    /// Sizes are multiplied together (rows = heads x head dim, ...): bounded
    /// this way, no product of three of them overflows a u64.
    pub fn size_checked(&self, k: Key, v: usize) -> Result<usize> {
        if v > MAX_SIZE {
            return Err(self.err(
                k,
                format!("{v} is larger than the {MAX_SIZE} onebit accepts for a model size: corrupt or not a model"),
            ));
        }
        Ok(v)
    }

    pub fn bool_opt(&self, k: Key) -> Result<Option<bool>> {
        match self.get(k) {
            None => Ok(None),
            Some(v) => v
                .as_bool()
                .map(Some)
                .ok_or_else(|| self.err(k, format!("expected true or false, found {v}"))),
        }
    }

    pub fn str_opt(&self, k: Key) -> Result<Option<String>> {
        match self.get(k) {
            None => Ok(None),
            Some(Json::String(s)) => Ok(Some(s)),
            Some(v) => Err(self.err(k, format!("expected a string, found {v}"))),
        }
    }
}

/// `a/b` descends into objects.
fn lookup<'j>(cfg: &'j Json, path: &str) -> Option<&'j Json> {
    path.split('/').try_fold(cfg, |v, part| v.get(part))
}

fn to_json(v: &Value) -> Json {
    match v {
        Value::U8(x) => Json::from(*x),
        Value::I8(x) => Json::from(*x),
        Value::U16(x) => Json::from(*x),
        Value::I16(x) => Json::from(*x),
        Value::U32(x) => Json::from(*x),
        Value::I32(x) => Json::from(*x),
        Value::U64(x) => Json::from(*x),
        Value::I64(x) => Json::from(*x),
        Value::F32(x) => serde_json::Number::from_f64(*x as f64).map_or(Json::Null, Json::Number),
        Value::F64(x) => serde_json::Number::from_f64(*x).map_or(Json::Null, Json::Number),
        Value::Bool(b) => Json::Bool(*b),
        Value::Str(s) => Json::String(s.clone()),
        Value::Array(a) => Json::Array(a.iter().map(to_json).collect()),
    }
}
