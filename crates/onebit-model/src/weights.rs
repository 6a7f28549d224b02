//! Loading tensors by name into the forward's weights, each checked against the
//! shape the semantics imply. Names are GGUF's (`blk.N.attn_q.weight`); other
//! containers map their names to these.

use std::path::{Path, PathBuf};

use onebit_formats::gguf::Gguf;
use onebit_formats::{blocks, ByteView, GgmlType};
use onebit_kernels::QMatrix;

use crate::error::{ModelError, Result};
use crate::semantics::{NormForm, QkNorm, Semantics};

/// A tensor as a container holds it. `dims` in ggml order (contiguous first).
#[derive(Clone, Debug)]
pub struct RawTensor {
    pub dtype: GgmlType,
    pub dims: Vec<u64>,
    pub bytes: ByteView,
}

/// Where weights come from: a GGUF file, a pack, an in-memory test model.
pub trait TensorSource {
    fn path(&self) -> &Path;
    fn tensor(&self, name: &str) -> Option<RawTensor>;
}

impl TensorSource for Gguf {
    fn path(&self) -> &Path {
        Gguf::path(self)
    }
    fn tensor(&self, name: &str) -> Option<RawTensor> {
        let info = Gguf::tensor(self, name)?;
        Some(RawTensor {
            dtype: info.dtype,
            dims: info.dims.clone(),
            bytes: self.tensor_bytes(info),
        })
    }
}

pub struct LayerWeights {
    pub attn_norm: Vec<f32>,
    pub wq: QMatrix,
    pub wk: QMatrix,
    pub wv: QMatrix,
    pub wo: QMatrix,
    pub bq: Option<Vec<f32>>,
    pub bk: Option<Vec<f32>>,
    pub bv: Option<Vec<f32>>,
    pub q_norm: Option<Vec<f32>>,
    pub k_norm: Option<Vec<f32>>,
    pub post_attn_norm: Option<Vec<f32>>,
    pub ffn_norm: Vec<f32>,
    pub gate: QMatrix,
    pub up: QMatrix,
    pub down: QMatrix,
    pub post_ffn_norm: Option<Vec<f32>>,
}

pub struct Weights {
    /// [n_vocab rows][n_embd]
    pub token_embd: QMatrix,
    pub output_norm: Vec<f32>,
    /// [n_vocab rows][n_embd]; the embedding itself when tied.
    pub output: QMatrix,
    pub rope_freqs: Option<Vec<f32>>,
    pub layers: Vec<LayerWeights>,
}

struct Loader<'a> {
    src: &'a dyn TensorSource,
    norm_form: NormForm,
}

impl<'a> Loader<'a> {
    fn path(&self) -> PathBuf {
        self.src.path().to_path_buf()
    }
    fn err(&self, name: &str, what: String) -> ModelError {
        ModelError::Tensor {
            path: self.path(),
            tensor: name.into(),
            what,
        }
    }
    fn get(&self, name: &str) -> Result<RawTensor> {
        self.src.tensor(name).ok_or_else(|| {
            self.err(
                name,
                "is required by the model's semantics but absent".into(),
            )
        })
    }

    /// A weight matrix of `rows` outputs by `cols` inputs (ggml dims [cols, rows]).
    fn matrix(&self, name: &str, rows: usize, cols: usize) -> Result<QMatrix> {
        let t = self.get(name)?;
        let want = [cols as u64, rows as u64];
        if t.dims != want {
            return Err(self.err(
                name,
                format!(
                    "has shape {:?}, expected {want:?} (ggml order: inputs, outputs)",
                    t.dims
                ),
            ));
        }
        QMatrix::new(t.dtype, rows, cols, t.bytes).map_err(|e| self.err(name, e))
    }

    /// A vector of `len` floats, decoded from whatever type the container holds.
    fn vector(&self, name: &str, len: usize) -> Result<Vec<f32>> {
        let t = self.get(name)?;
        if t.dims != [len as u64] {
            return Err(self.err(name, format!("has shape {:?}, expected [{len}]", t.dims)));
        }
        let mut out = vec![0f32; len];
        blocks::dequantize(t.dtype, &t.bytes, &mut out)
            .map_err(|e| self.err(name, e.to_string()))?;
        Ok(out)
    }

    fn vector_opt(&self, name: &str, len: usize) -> Result<Option<Vec<f32>>> {
        if self.src.tensor(name).is_none() {
            return Ok(None);
        }
        self.vector(name, len).map(Some)
    }

    /// A norm weight, in the form the forward multiplies by.
    fn norm(&self, name: &str, len: usize) -> Result<Vec<f32>> {
        let mut w = self.vector(name, len)?;
        if self.norm_form == NormForm::OnePlus {
            w.iter_mut().for_each(|v| *v += 1.0);
        }
        Ok(w)
    }
}

pub fn load(src: &dyn TensorSource, sem: &Semantics) -> Result<Weights> {
    let l = Loader {
        src,
        norm_form: sem.norm_form.value,
    };
    let d = &sem.dims;
    let token_embd = l.matrix("token_embd.weight", d.n_vocab, d.n_embd)?;
    let output = if sem.tied_output.value {
        token_embd.clone()
    } else {
        l.matrix("output.weight", d.n_vocab, d.n_embd)?
    };
    let output_norm = l.norm("output_norm.weight", d.n_embd)?;
    let rope_freqs = if sem.rope_full.value.freq_factors {
        Some(l.vector("rope_freqs.weight", sem.rope_full.value.n_rot / 2)?)
    } else {
        None
    };

    let q_width = d.n_head * d.head_dim_k;
    let k_width = d.n_head_kv * d.head_dim_k;
    let v_width = d.n_head_kv * d.head_dim_v;
    let o_in = d.n_head * d.head_dim_v;
    let mut layers = Vec::with_capacity(d.n_layer);
    for (i, &kind) in sem.layer_kinds.value.iter().enumerate() {
        if !kind.is_attention() {
            return Err(ModelError::Unsupported {
                path: l.path(),
                what: format!("layer {i} is a {kind:?} layer, which this forward does not run yet"),
            });
        }
        let n = |s: &str| format!("blk.{i}.{s}");
        let (q_norm, k_norm) = if sem.qk_norm.value != QkNorm::None {
            // A declared q/k norm without its tensors would silently run unnormalised.
            (
                Some(l.norm(&n("attn_q_norm.weight"), d.head_dim_k)?),
                Some(l.norm(&n("attn_k_norm.weight"), d.head_dim_k)?),
            )
        } else {
            (None, None)
        };
        let (post_attn_norm, post_ffn_norm) = if sem.sandwich_norms.value {
            (
                Some(l.norm(&n("post_attention_norm.weight"), d.n_embd)?),
                Some(l.norm(&n("post_ffw_norm.weight"), d.n_embd)?),
            )
        } else {
            (None, None)
        };
        layers.push(LayerWeights {
            attn_norm: l.norm(&n("attn_norm.weight"), d.n_embd)?,
            wq: l.matrix(&n("attn_q.weight"), q_width, d.n_embd)?,
            wk: l.matrix(&n("attn_k.weight"), k_width, d.n_embd)?,
            wv: l.matrix(&n("attn_v.weight"), v_width, d.n_embd)?,
            wo: l.matrix(&n("attn_output.weight"), d.n_embd, o_in)?,
            bq: l.vector_opt(&n("attn_q.bias"), q_width)?,
            bk: l.vector_opt(&n("attn_k.bias"), k_width)?,
            bv: l.vector_opt(&n("attn_v.bias"), v_width)?,
            q_norm,
            k_norm,
            post_attn_norm,
            ffn_norm: l.norm(&n("ffn_norm.weight"), d.n_embd)?,
            gate: l.matrix(&n("ffn_gate.weight"), d.n_ff, d.n_embd)?,
            up: l.matrix(&n("ffn_up.weight"), d.n_ff, d.n_embd)?,
            down: l.matrix(&n("ffn_down.weight"), d.n_embd, d.n_ff)?,
            post_ffn_norm,
        });
    }
    Ok(Weights {
        token_embd,
        output_norm,
        output,
        rope_freqs,
        layers,
    })
}
