//! Loading tensors by name into the forward's weights, each checked against the
//! shape the semantics imply. Names are GGUF's (`blk.N.attn_q.weight`); other
//! containers map their names to these.

use std::path::{Path, PathBuf};

use onebit_formats::gguf::Gguf;
use onebit_formats::{blocks, ByteView, GgmlType};
use onebit_kernels::QMatrix;

use crate::error::{ModelError, Result};
use crate::semantics::{LayerKind, Moe, NormForm, QkNorm, RouterInput, Semantics};

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

pub struct AttnWeights {
    /// [n_head * head_dim_k] rows, or twice that with an output gate
    /// ([q_h | gate_h] per head).
    pub wq: QMatrix,
    pub wo: QMatrix,
    pub bq: Option<Vec<f32>>,
    /// `attn_output.bias` (`Semantics::attn_out_bias`), \[n_embd\].
    pub bo: Option<Vec<f32>>,
    /// `Semantics::attn_sinks`: one logit per query head.
    pub sinks: Option<Vec<f32>>,
    pub q_norm: Option<Vec<f32>>,
    /// The layer's own K/V projections; None for a layer that reads an
    /// earlier layer's KV cache (`Semantics::kv_source`).
    pub kv: Option<KvWeights>,
}

pub struct KvWeights {
    pub wk: QMatrix,
    /// None: V is the K projection (`Semantics::v_from_k`).
    pub wv: Option<QMatrix>,
    pub bk: Option<Vec<f32>>,
    pub bv: Option<Vec<f32>>,
    pub k_norm: Option<Vec<f32>>,
}

/// Gemma 4's per-layer embeddings: the inputs, computed once per call.
pub struct PerLayerInput {
    /// [n_vocab rows][n_layer * width]
    pub token_embd: QMatrix,
    /// [n_layer * width rows]\[n_embd\]
    pub model_proj: QMatrix,
    /// \[width\]
    pub proj_norm: Vec<f32>,
}

/// One layer's per-layer-embedding branch.
pub struct PerLayerBranch {
    /// [width rows]\[n_embd\]
    pub inp_gate: QMatrix,
    /// [n_embd rows]\[width\]
    pub proj: QMatrix,
    pub post_norm: Vec<f32>,
}

pub struct ShortConvWeights {
    /// [3 * n_embd] rows: B, C, x.
    pub in_proj: QMatrix,
    /// \[n_embd\]\[L\] taps; tap j multiplies input t - (L - 1) + j.
    pub kernel: Vec<f32>,
    pub out_proj: QMatrix,
}

pub struct DeltaNetWeights {
    /// [q | k | v] rows: n_k_heads*dk, n_k_heads*dk, n_v_heads*dv.
    pub qkv: QMatrix,
    /// z for the output gate: [n_v_heads * dv] rows.
    pub gate: QMatrix,
    pub beta: QMatrix,
    pub alpha: QMatrix,
    pub dt_bias: Vec<f32>,
    /// -exp(A_log), per v head.
    pub a: Vec<f32>,
    /// \[channels\]\[kernel\] taps over the q|k|v channels.
    pub conv: Vec<f32>,
    pub norm: Vec<f32>,
    pub out: QMatrix,
}

pub enum Mixer {
    Attention(AttnWeights),
    ShortConv(ShortConvWeights),
    DeltaNet(DeltaNetWeights),
}

pub struct FfnWeights {
    pub gate: QMatrix,
    pub up: QMatrix,
    pub down: QMatrix,
}

/// A routed-experts FFN's weights (`Semantics::moe`).
pub struct RoutedWeights {
    /// `ffn_gate_inp`: [n_expert rows]\[n_embd\].
    pub router: QMatrix,
    pub router_bias: Option<Vec<f32>>,
    /// `exp_probs_b`: added to the scores to choose the experts.
    pub selection_bias: Option<Vec<f32>>,
    /// Each expert's slices of the stacked `ffn_{gate,up,down}_exps`
    /// (or of the fused `ffn_gate_up_exps`): views of the tensors' bytes.
    pub experts: Vec<FfnWeights>,
    /// The shared expert (`Moe::shared_names`).
    pub shared: Option<FfnWeights>,
    /// `ffn_gate_inp_shexp`: [1 row]\[n_embd\].
    pub shared_gate: Option<QMatrix>,
    /// `Moe::router_input`'s per-channel scale (`ffn_gate_inp.scale`), \[n_embd\].
    pub router_scale: Option<Vec<f32>>,
    /// `Moe::expert_scale`'s values, \[n_expert\].
    pub expert_scale: Option<Vec<f32>>,
    /// `Moe::expert_biases`: per expert, \[n_ff_exp\], \[n_ff_exp\], \[n_embd\].
    pub expert_biases: Option<Vec<[Vec<f32>; 3]>>,
    /// `Moe::branch_norms`'s weights.
    pub branch_norms: Option<BranchNormWeights>,
}

/// Gemma 4's norms around an expert layer's two branches ([`crate::semantics::BranchNorms`]).
pub struct BranchNormWeights {
    pub experts_in: Vec<f32>,
    pub experts_out: Vec<f32>,
    pub shared_out: Vec<f32>,
}

/// A layer's feed-forward: dense, or routed experts.
// One per layer, held for the model's life: the variants' sizes do not matter.
#[allow(clippy::large_enum_variant)]
pub enum Ffn {
    Dense(FfnWeights),
    Routed(RoutedWeights),
}

pub struct LayerWeights {
    pub attn_norm: Vec<f32>,
    pub mixer: Mixer,
    pub post_attn_norm: Option<Vec<f32>>,
    pub ffn_norm: Vec<f32>,
    pub ffn: Ffn,
    pub post_ffn_norm: Option<Vec<f32>>,
    pub per_layer: Option<PerLayerBranch>,
    /// The layer output scale (Gemma 4).
    pub out_scale: Option<f32>,
}

pub struct Weights {
    /// [n_vocab rows]\[n_embd\]
    pub token_embd: QMatrix,
    pub output_norm: Vec<f32>,
    /// [n_vocab rows]\[n_embd\]; the embedding itself when tied.
    pub output: QMatrix,
    /// RoPE per-pair factors by tensor name, for the tables the semantics name.
    pub rope_factors: Vec<(String, Vec<f32>)>,
    pub per_layer_input: Option<PerLayerInput>,
    pub layers: Vec<LayerWeights>,
    /// The semantics' `pooled_head` matrices, in order.
    pub pooled_head: Vec<QMatrix>,
}

impl Weights {
    /// Every matrix the forward multiplies by (the tied output once), in the
    /// order a forward reads them: the repacked copies are laid out so.
    pub fn matrices(&self) -> Vec<&QMatrix> {
        let mut m = Vec::new();
        if let Some(p) = &self.per_layer_input {
            m.push(&p.model_proj);
        }
        for l in &self.layers {
            match &l.mixer {
                Mixer::Attention(a) => {
                    m.push(&a.wq);
                    if let Some(kv) = &a.kv {
                        m.push(&kv.wk);
                        m.extend(kv.wv.iter());
                    }
                    m.push(&a.wo);
                }
                Mixer::ShortConv(c) => m.extend([&c.in_proj, &c.out_proj]),
                Mixer::DeltaNet(d) => m.extend([&d.qkv, &d.gate, &d.beta, &d.alpha, &d.out]),
            }
            match &l.ffn {
                Ffn::Dense(f) => m.extend([&f.gate, &f.up, &f.down]),
                Ffn::Routed(r) => {
                    m.push(&r.router);
                    m.extend(r.shared_gate.iter());
                    for f in r.experts.iter().chain(r.shared.iter()) {
                        m.extend([&f.gate, &f.up, &f.down]);
                    }
                }
            }
            if let Some(p) = &l.per_layer {
                m.extend([&p.inp_gate, &p.proj]);
            }
        }
        m.push(&self.output);
        m.extend(&self.pooled_head);
        m
    }
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
    fn has(&self, name: &str) -> bool {
        self.src.tensor(name).is_some()
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

    /// A fused matrix split by rows into parts of the given heights.
    fn split_matrix(&self, name: &str, parts: &[usize], cols: usize) -> Result<Vec<QMatrix>> {
        let whole = self.matrix(name, parts.iter().sum(), cols)?;
        let rb = whole.row_bytes();
        let mut at = 0;
        parts
            .iter()
            .map(|&rows| {
                let bytes = whole.data.slice(at * rb, rows * rb);
                at += rows;
                QMatrix::new(whole.dtype, rows, cols, bytes).map_err(|e| self.err(name, e))
            })
            .collect()
    }

    /// A stacked 3-D tensor of `n` matrices of `rows` x `cols` (ggml dims
    /// [cols, rows, n]), one view per matrix, each cut into row parts of
    /// the given heights (one part: the whole matrix).
    fn stacked(
        &self,
        name: &str,
        parts: &[usize],
        cols: usize,
        n: usize,
    ) -> Result<Vec<Vec<QMatrix>>> {
        let t = self.get(name)?;
        let rows: usize = parts.iter().sum();
        let want = [cols as u64, rows as u64, n as u64];
        if t.dims != want {
            return Err(self.err(
                name,
                format!(
                    "has shape {:?}, expected {want:?} (ggml order: inputs, outputs, experts)",
                    t.dims
                ),
            ));
        }
        let rb = t.dtype.row_bytes(cols as u64).ok_or_else(|| {
            self.err(
                name,
                format!("rows of {cols} are not whole {} blocks", t.dtype),
            )
        })? as usize;
        if t.bytes.len() != rb * rows * n {
            return Err(self.err(
                name,
                format!("holds {} bytes, expected {}", t.bytes.len(), rb * rows * n),
            ));
        }
        (0..n)
            .map(|e| {
                let mut at = e * rows * rb;
                parts
                    .iter()
                    .map(|&r| {
                        let bytes = t.bytes.slice(at, r * rb);
                        at += r * rb;
                        QMatrix::new(t.dtype, r, cols, bytes).map_err(|m| self.err(name, m))
                    })
                    .collect()
            })
            .collect()
    }

    /// Floats of a small tensor whose element count must be `len`.
    fn floats(&self, name: &str, len: usize) -> Result<Vec<f32>> {
        let t = self.get(name)?;
        let n: u64 = t.dims.iter().product();
        if n != len as u64 {
            return Err(self.err(
                name,
                format!("has shape {:?} ({n} values), expected {len} values", t.dims),
            ));
        }
        let mut out = vec![0f32; len];
        blocks::dequantize(t.dtype, &t.bytes, &mut out)
            .map_err(|e| self.err(name, e.to_string()))?;
        // Copied: the file's pages (and the read-around that came with
        // them, ~64 KiB per small tensor) need not stay resident.
        t.bytes.release_pages();
        Ok(out)
    }

    /// A vector of `len` floats, shape checked.
    fn vector(&self, name: &str, len: usize) -> Result<Vec<f32>> {
        let t = self.get(name)?;
        if t.dims != [len as u64] {
            return Err(self.err(name, format!("has shape {:?}, expected [{len}]", t.dims)));
        }
        self.floats(name, len)
    }

    fn vector_opt(&self, name: &str, len: usize) -> Result<Option<Vec<f32>>> {
        if !self.has(name) {
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
    let body = &sem.body.value;
    let output_norm = l.norm(body.output_norm, d.n_embd)?;
    let mut rope_factors = Vec::new();
    for spec in [&sem.rope_full.value, &sem.rope_sliding.value] {
        let names = spec
            .freq_factors
            .iter()
            .chain(spec.long_factors.iter().map(|(n, _)| n));
        for name in names {
            if !rope_factors.iter().any(|(n, _)| n == name) {
                rope_factors.push((name.clone(), l.floats(name, spec.n_rot / 2)?));
            }
        }
    }

    let pl = body.per_layer_input;
    let per_layer_input = if pl > 0 {
        let width = d.n_layer * pl;
        Some(PerLayerInput {
            token_embd: l.matrix("per_layer_token_embd.weight", d.n_vocab, width)?,
            model_proj: l.matrix("per_layer_model_proj.weight", width, d.n_embd)?,
            proj_norm: l.norm("per_layer_proj_norm.weight", pl)?,
        })
    } else {
        None
    };

    let mut layers = Vec::with_capacity(d.n_layer);
    for (i, &kind) in sem.layer_kinds.value.iter().enumerate() {
        let n = |s: &str| format!("blk.{i}.{s}");
        let mixer = match kind {
            LayerKind::Full | LayerKind::Sliding => Mixer::Attention(attention(&l, sem, i)?),
            LayerKind::ShortConv => Mixer::ShortConv(short_conv(&l, sem, i)?),
            LayerKind::DeltaNet => Mixer::DeltaNet(delta_net(&l, sem, i)?),
        };
        let post_norm = |name: Option<&str>| name.map(|t| l.norm(&n(t), d.n_embd)).transpose();
        let post_attn_norm = post_norm(body.post_mixer_norm)?;
        let post_ffn_norm = post_norm(body.post_ffn_norm)?;
        // Phi-3 fuses gate and up into ffn_up (gate rows first).
        let fused = !l.has(&n("ffn_gate.weight")) && l.has(&n("ffn_up.weight"));
        let gate_up = || -> Result<(QMatrix, QMatrix)> {
            if fused {
                let mut parts = l.split_matrix(&n("ffn_up.weight"), &[d.n_ff, d.n_ff], d.n_embd)?;
                let up = parts.pop().expect("two parts");
                Ok((parts.pop().expect("two parts"), up))
            } else {
                Ok((
                    l.matrix(&n("ffn_gate.weight"), d.n_ff, d.n_embd)?,
                    l.matrix(&n("ffn_up.weight"), d.n_ff, d.n_embd)?,
                ))
            }
        };
        let ffn = match &sem.moe {
            Some(m) if m.value.routed(i) => Ffn::Routed(routed(&l, sem, &m.value, i)?),
            _ => {
                let (gate, up) = gate_up()?;
                Ffn::Dense(FfnWeights {
                    gate,
                    up,
                    down: l.matrix(&n("ffn_down.weight"), d.n_embd, d.n_ff)?,
                })
            }
        };
        layers.push(LayerWeights {
            attn_norm: l.norm(&n(body.mixer_norm), d.n_embd)?,
            mixer,
            post_attn_norm,
            ffn_norm: l.norm(&n(body.ffn_norm), d.n_embd)?,
            ffn,
            post_ffn_norm,
            per_layer: if pl > 0 {
                Some(PerLayerBranch {
                    inp_gate: l.matrix(&n("inp_gate.weight"), pl, d.n_embd)?,
                    proj: l.matrix(&n("proj.weight"), d.n_embd, pl)?,
                    post_norm: l.norm(&n("post_norm.weight"), d.n_embd)?,
                })
            } else {
                None
            },
            out_scale: match body.output_scale {
                Some(t) => Some(l.floats(&n(t), 1)?[0]),
                None => None,
            },
        });
    }
    let pooled_head = sem
        .pooled_head
        .value
        .iter()
        .map(|(name, rows, cols)| l.matrix(name, *rows, *cols))
        .collect::<Result<Vec<_>>>()?;
    Ok(Weights {
        token_embd,
        output_norm,
        output,
        rope_factors,
        per_layer_input,
        layers,
        pooled_head,
    })
}

/// Layer `i`'s routed experts, their router and shared expert.
fn routed(l: &Loader, sem: &Semantics, m: &Moe, i: usize) -> Result<RoutedWeights> {
    let d = &sem.dims;
    let n = |s: &str| format!("blk.{i}.{s}");
    let (e, ff, ne) = (d.n_embd, m.n_ff_exp, m.n_expert);
    let (gates, ups): (Vec<QMatrix>, Vec<QMatrix>) = if l.has(&n("ffn_gate_up_exps.weight")) {
        let pairs = l.stacked(&n("ffn_gate_up_exps.weight"), &[ff, ff], e, ne)?;
        pairs
            .into_iter()
            .map(|mut p| {
                let up = p.pop().expect("two parts");
                (p.pop().expect("two parts"), up)
            })
            .unzip()
    } else {
        let one = |name: &str| -> Result<Vec<QMatrix>> {
            Ok(l.stacked(&n(name), &[ff], e, ne)?
                .into_iter()
                .map(|mut p| p.pop().expect("one part"))
                .collect())
        };
        (one("ffn_gate_exps.weight")?, one("ffn_up_exps.weight")?)
    };
    let downs = l.stacked(&n("ffn_down_exps.weight"), &[e], ff, ne)?;
    let experts = gates
        .into_iter()
        .zip(ups)
        .zip(downs)
        .map(|((gate, up), mut down)| FfnWeights {
            gate,
            up,
            down: down.pop().expect("one part"),
        })
        .collect();
    let selection_bias = if m.selection_bias.value {
        Some(l.vector(&n("exp_probs_b.bias"), ne)?)
    } else {
        if l.has(&n("exp_probs_b.bias")) {
            return Err(l.err(
                &n("exp_probs_b.bias"),
                format!(
                    "is present, but the routing declares no selection bias ({})",
                    m.selection_bias.source
                ),
            ));
        }
        None
    };
    let [sg, su, sd] = m.shared_names;
    let shared = match m.shared.value {
        Some(w) => Some(FfnWeights {
            gate: l.matrix(&n(sg), w, e)?,
            up: l.matrix(&n(su), w, e)?,
            down: l.matrix(&n(sd), e, w)?,
        }),
        None => None,
    };
    // Per-expert scales llama.cpp would apply to the gate and up products
    // (its `ffn_{gate,up}_exps_s`): not run here.
    for t in [
        "ffn_gate_exps.scale",
        "ffn_up_exps.scale",
        "ffn_gate_up_exps.scale",
    ] {
        if l.has(&n(t)) {
            return Err(l.err(
                &n(t),
                "per-expert scales of the gate and up products are not implemented".into(),
            ));
        }
    }
    let expert_scale = match m.expert_scale.value {
        Some(t) => Some(l.vector(&n(t), ne)?),
        None => {
            let t = n(crate::families::moe::EXPERT_SCALE);
            if l.has(&t) {
                return Err(l.err(
                    &t,
                    format!(
                        "is present, but the routing declares no expert output scale ({})",
                        m.expert_scale.source
                    ),
                ));
            }
            None
        }
    };
    let router_scale = match m.router_input.value {
        RouterInput::FfnInput => None,
        RouterInput::ScaledRms(t) => Some(l.vector(&n(t), e)?),
    };
    let branch_norms = match m.branch_norms.value {
        Some(b) => Some(BranchNormWeights {
            experts_in: l.norm(&n(b.experts_in), e)?,
            experts_out: l.norm(&n(b.experts_out), e)?,
            shared_out: l.norm(&n(b.shared_out), e)?,
        }),
        None => None,
    };
    let shared_gate = if m.shared_gate.value {
        let name = n("ffn_gate_inp_shexp.weight");
        let t = l.get(&name)?;
        if t.dims != [e as u64] && t.dims != [e as u64, 1] {
            return Err(l.err(&name, format!("has shape {:?}, expected [{e}]", t.dims)));
        }
        Some(QMatrix::new(t.dtype, 1, e, t.bytes).map_err(|m| l.err(&name, m))?)
    } else {
        None
    };
    let expert_biases = if m.expert_biases.value {
        let stack = |name: &str, len: usize| -> Result<Vec<Vec<f32>>> {
            let name = n(name);
            let t = l.get(&name)?;
            if t.dims != [len as u64, ne as u64] {
                return Err(l.err(
                    &name,
                    format!("has shape {:?}, expected [{len}, {ne}]", t.dims),
                ));
            }
            Ok(l.floats(&name, len * ne)?
                .chunks_exact(len)
                .map(<[f32]>::to_vec)
                .collect())
        };
        let (g, u, dn) = (
            stack("ffn_gate_exps.bias", ff)?,
            stack("ffn_up_exps.bias", ff)?,
            stack("ffn_down_exps.bias", e)?,
        );
        Some(
            g.into_iter()
                .zip(u)
                .zip(dn)
                .map(|((g, u), d)| [g, u, d])
                .collect(),
        )
    } else {
        for t in [
            "ffn_gate_exps.bias",
            "ffn_up_exps.bias",
            "ffn_down_exps.bias",
        ] {
            if l.has(&n(t)) {
                return Err(l.err(
                    &n(t),
                    format!(
                        "is present, but the routing declares no expert biases ({})",
                        m.expert_biases.source
                    ),
                ));
            }
        }
        None
    };
    Ok(RoutedWeights {
        expert_biases,
        router: l.matrix(&n("ffn_gate_inp.weight"), ne, e)?,
        // gpt-oss's graph requires its router bias (ffn_gate_inp_b).
        router_bias: if m.expert_biases.value {
            Some(l.vector(&n("ffn_gate_inp.bias"), ne)?)
        } else {
            l.vector_opt(&n("ffn_gate_inp.bias"), ne)?
        },
        selection_bias,
        experts,
        shared,
        shared_gate,
        router_scale,
        expert_scale,
        branch_norms,
    })
}

fn attention(l: &Loader, sem: &Semantics, i: usize) -> Result<AttnWeights> {
    let d = &sem.dims;
    let n = |s: &str| format!("blk.{i}.{s}");
    let kind = sem.layer_kinds.value[i];
    let (dk, dv) = sem.head_dims(kind);
    let q_rows = d.n_head * dk * if sem.attn_output_gate.value { 2 } else { 1 };
    let (k_rows, v_rows) = sem.kv_widths(kind);
    if sem.kv_source.value[i] != i {
        // Reads an earlier layer's KV cache: q and the output only.
        let q_norm = if sem.qk_norm.value != QkNorm::None {
            Some(l.norm(&n("attn_q_norm.weight"), dk)?)
        } else {
            None
        };
        return Ok(AttnWeights {
            wq: l.matrix(&n("attn_q.weight"), q_rows, d.n_embd)?,
            wo: l.matrix(&n("attn_output.weight"), d.n_embd, d.n_head * dv)?,
            bq: l.vector_opt(&n("attn_q.bias"), d.n_head * dk)?,
            bo: out_bias(l, sem, i)?,
            sinks: sinks(l, sem, i)?,
            q_norm,
            kv: None,
        });
    }
    let v_from_k = sem.v_from_k.value[i];
    if v_from_k {
        // V is the K projection: a V of its own would go unused.
        for t in ["attn_qkv.weight", "attn_v.weight", "attn_v.bias"] {
            if l.has(&n(t)) {
                return Err(l.err(
                    &n(t),
                    format!(
                        "is present, but this layer's V is declared to be its K projection ({})",
                        sem.v_from_k.source
                    ),
                ));
            }
        }
        if dk != dv {
            return Err(l.err(
                &n("attn_k.weight"),
                format!("V from K needs equal k and v head sizes, found {dk} and {dv}"),
            ));
        }
    }
    let (wq, wk, wv) = if l.has(&n("attn_qkv.weight")) {
        let mut p = l.split_matrix(&n("attn_qkv.weight"), &[q_rows, k_rows, v_rows], d.n_embd)?;
        let wv = p.pop().expect("three parts");
        let wk = p.pop().expect("three parts");
        (p.pop().expect("three parts"), wk, Some(wv))
    } else {
        (
            l.matrix(&n("attn_q.weight"), q_rows, d.n_embd)?,
            l.matrix(&n("attn_k.weight"), k_rows, d.n_embd)?,
            (!v_from_k)
                .then(|| l.matrix(&n("attn_v.weight"), v_rows, d.n_embd))
                .transpose()?,
        )
    };
    // A declared q/k norm without its tensors would silently run unnormalised.
    let (q_norm, k_norm) = if sem.qk_norm.value != QkNorm::None {
        for t in ["attn_q_norm.weight", "attn_k_norm.weight"] {
            if !l.has(&n(t)) {
                return Err(l.err(
                    &n(t),
                    format!(
                        "is absent, but q/k RMSNorm is declared ({}) for this attention layer",
                        sem.qk_norm.source
                    ),
                ));
            }
        }
        (
            Some(l.norm(&n("attn_q_norm.weight"), dk)?),
            Some(l.norm(&n("attn_k_norm.weight"), dk)?),
        )
    } else {
        (None, None)
    };
    let biases = sem.attn_bias.value;
    let bias = |name: &str, len| {
        if biases {
            l.vector(&n(name), len).map(Some)
        } else {
            l.vector_opt(&n(name), len)
        }
    };
    Ok(AttnWeights {
        wq,
        wo: l.matrix(&n("attn_output.weight"), d.n_embd, d.n_head * dv)?,
        bq: bias("attn_q.bias", d.n_head * dk)?,
        bo: out_bias(l, sem, i)?,
        sinks: sinks(l, sem, i)?,
        q_norm,
        kv: Some(KvWeights {
            wk,
            wv,
            bk: bias("attn_k.bias", k_rows)?,
            bv: if v_from_k {
                None
            } else {
                bias("attn_v.bias", v_rows)?
            },
            k_norm,
        }),
    })
}

/// `attn_output.bias`, required when the semantics declare it, refused when
/// they do not (it would be silently dropped).
fn out_bias(l: &Loader, sem: &Semantics, i: usize) -> Result<Option<Vec<f32>>> {
    let name = format!("blk.{i}.attn_output.bias");
    if sem.attn_out_bias.value {
        return l.vector(&name, sem.dims.n_embd).map(Some);
    }
    if l.has(&name) {
        return Err(l.err(
            &name,
            format!(
                "is present, but no output bias is declared ({})",
                sem.attn_out_bias.source
            ),
        ));
    }
    Ok(None)
}

/// The attention sinks, one per query head, when the semantics name them;
/// an undeclared `attn_sinks.weight` is refused.
fn sinks(l: &Loader, sem: &Semantics, i: usize) -> Result<Option<Vec<f32>>> {
    match sem.attn_sinks.value {
        Some(t) => l.vector(&format!("blk.{i}.{t}"), sem.dims.n_head).map(Some),
        None => {
            let name = format!("blk.{i}.attn_sinks.weight");
            if l.has(&name) {
                return Err(l.err(
                    &name,
                    format!(
                        "is present, but no attention sinks are declared ({})",
                        sem.attn_sinks.source
                    ),
                ));
            }
            Ok(None)
        }
    }
}

fn short_conv(l: &Loader, sem: &Semantics, i: usize) -> Result<ShortConvWeights> {
    let d = &sem.dims;
    let n = |s: &str| format!("blk.{i}.{s}");
    let declared = sem.short_conv.as_ref().map(|s| s.value);
    let name = n("shortconv.conv.weight");
    let t = l.get(&name)?;
    // The kernel length is read from the tensor, and one length runs per model.
    let len = match t.dims.as_slice() {
        [k, c] if *c == d.n_embd as u64 => *k as usize,
        other => {
            return Err(l.err(
                &name,
                format!("has shape {other:?}, expected [L, {}]", d.n_embd),
            ))
        }
    };
    if declared != Some(len) {
        return Err(l.err(
            &name,
            format!("kernel length {len} differs from the declared short-conv length {declared:?}"),
        ));
    }
    Ok(ShortConvWeights {
        in_proj: l.matrix(&n("shortconv.in_proj.weight"), 3 * d.n_embd, d.n_embd)?,
        kernel: l.floats(&name, len * d.n_embd)?,
        out_proj: l.matrix(&n("shortconv.out_proj.weight"), d.n_embd, d.n_embd)?,
    })
}

fn delta_net(l: &Loader, sem: &Semantics, i: usize) -> Result<DeltaNetWeights> {
    let d = &sem.dims;
    let n = |s: &str| format!("blk.{i}.{s}");
    let dn = &sem
        .delta_net
        .as_ref()
        .ok_or_else(|| {
            l.err(
                &n("attn_qkv.weight"),
                "a linear-attention layer without delta-net sizes".into(),
            )
        })?
        .value;
    let qk = dn.n_k_heads * dn.head_k_dim;
    let v = dn.n_v_heads * dn.head_v_dim;
    let channels = 2 * qk + v;
    let conv_name = n("ssm_conv1d.weight");
    let t = l.get(&conv_name)?;
    if t.dims != [dn.conv_kernel as u64, channels as u64] {
        return Err(l.err(
            &conv_name,
            format!(
                "has shape {:?}, expected [{}, {channels}]",
                t.dims, dn.conv_kernel
            ),
        ));
    }
    Ok(DeltaNetWeights {
        qkv: l.matrix(&n("attn_qkv.weight"), channels, d.n_embd)?,
        gate: l.matrix(&n("attn_gate.weight"), v, d.n_embd)?,
        beta: l.matrix(&n("ssm_beta.weight"), dn.n_v_heads, d.n_embd)?,
        alpha: l.matrix(&n("ssm_alpha.weight"), dn.n_v_heads, d.n_embd)?,
        dt_bias: l.vector(&n("ssm_dt.bias"), dn.n_v_heads)?,
        a: l.vector(&n("ssm_a"), dn.n_v_heads)?,
        conv: l.floats(&conv_name, channels * dn.conv_kernel)?,
        // ssm_norm is plain RMSNorm whatever the container does for other norms.
        norm: l.vector(&n("ssm_norm.weight"), dn.head_v_dim)?,
        out: l.matrix(&n("ssm_out.weight"), d.n_embd, v)?,
    })
}
