//! `onebit inspect --verify`: does the pack read as the model it was written
//! from? Two checks that a wrongly read tile form (or kind) fails:
//!
//! - the tie test: for a tied model, the correlation of the pack's quantized
//!   output matrix with its own unquantized embedding (FastFlowLM writes
//!   `lm_head.weight` from the embedding when the model is tied). The seeds
//!   measured 0.996 for the right reading of a pack and 0.09 for a wrong
//!   tile reading; below [`MIN_TIE_CORRELATION`] is a failure.
//! - for every tiled matrix, the fraction of rows whose decoded values are
//!   finite in the form the kernels run it in (bf16 scales and minimums as
//!   f16, so a scale beyond f16's range reads as infinite). Scales read from
//!   code bytes, as a wrong form reads them, leave nearly every row
//!   non-finite; a right reading leaves none.
//! - for a family with its own layout ([`super::OwnLayout`]), that
//!   layout's checks of what the converter writes twice or pads (gpt-oss:
//!   the biases kept inside the expert tiles against the bias tensors, the
//!   router's tiles against its row-major copy, every padding byte zero).
//! - for a pack with a vision tower (`vision_weights.q4nx`), its checks
//!   ([`super::vision::verify`]): it reads as a tower onebit runs that
//!   projects to the text model's width, and every stored byte is re-made
//!   from the tensors read by the converter's rules.

use onebit_formats::blocks;
use serde_json::Value as Json;

use super::{Form, Pack, PackTensor, CONFIG};
use crate::error::{ModelError, Result};

/// Below this the output matrix is not the embedding it was written from.
pub const MIN_TIE_CORRELATION: f64 = 0.9;

/// One tiled matrix's rows.
pub struct MatrixCheck {
    pub pack_name: String,
    pub form: Form,
    pub rows: usize,
    pub finite_rows: usize,
}

impl MatrixCheck {
    pub fn fraction(&self) -> f64 {
        self.finite_rows as f64 / self.rows.max(1) as f64
    }
}

/// The tie test's outcome.
pub enum Tie {
    Checked {
        output: String,
        embedding: String,
        correlation: f64,
        values: usize,
        /// Where "tied" was read.
        source: String,
    },
    /// Why there is nothing to compare.
    NotChecked(String),
}

/// One check of a pack layout's own invariants.
#[derive(Clone, Debug, PartialEq)]
pub struct LayoutCheck {
    /// What was compared, naming the tensors.
    pub what: String,
    /// How many values (bytes, biases, ...) were compared.
    pub values: usize,
    /// None: passed; else what differs, naming the first place.
    pub failure: Option<String>,
}

pub struct Report {
    pub matrices: Vec<MatrixCheck>,
    pub tie: Tie,
    /// The family layout's checks ([`super::OwnLayout::verify`]).
    pub layout: Vec<LayoutCheck>,
}

impl Report {
    /// One sentence per failed check, naming the tensor.
    pub fn failures(&self) -> Vec<String> {
        let mut out: Vec<String> = self
            .matrices
            .iter()
            .filter(|m| m.finite_rows < m.rows)
            .map(|m| {
                format!(
                    "{} ({}): {} of {} rows decode to non-finite values, so its tiles are not read in the form they were written in",
                    m.pack_name,
                    m.form,
                    m.rows - m.finite_rows,
                    m.rows
                )
            })
            .collect();
        if let Tie::Checked {
            output,
            embedding,
            correlation,
            ..
        } = &self.tie
        {
            if correlation.is_nan() || *correlation < MIN_TIE_CORRELATION {
                out.push(format!(
                    "{output}: correlation {correlation:.4} with {embedding}, below {MIN_TIE_CORRELATION}, so the output matrix does not read as the embedding it was written from"
                ));
            }
        }
        for c in &self.layout {
            if let Some(f) = &c.failure {
                out.push(format!("{}: {f}", c.what));
            }
        }
        out
    }
}

fn tiled(t: &PackTensor) -> bool {
    matches!(t.form, Form::Q4(..) | Form::Q8 | Form::Q8w | Form::Mx)
}

/// A tensor's rows decoded to f32 as the kernels see them.
struct Rows<'a> {
    t: &'a PackTensor,
    pack: &'a Pack,
    row_bytes: usize,
    n: usize,
}

impl<'a> Rows<'a> {
    fn new(pack: &'a Pack, t: &'a PackTensor) -> Result<Rows<'a>> {
        let k = t.raw.dims[0];
        let row_bytes = t
            .raw
            .dtype
            .row_bytes(k)
            .filter(|&rb| rb > 0)
            .ok_or_else(|| {
                Rows::error(
                    pack,
                    t,
                    format!("a row of {k} is not whole {} blocks", t.raw.dtype),
                )
            })? as usize;
        Ok(Rows {
            t,
            pack,
            row_bytes,
            n: t.raw.bytes.len() / row_bytes,
        })
    }
    fn error(pack: &Pack, t: &PackTensor, what: String) -> ModelError {
        ModelError::Tensor {
            path: pack.weights_path.clone(),
            tensor: t.pack_name.clone(),
            what,
        }
    }
    fn decode(&self, r: usize, out: &mut [f32]) -> Result<()> {
        let b = &self.t.raw.bytes[r * self.row_bytes..(r + 1) * self.row_bytes];
        blocks::dequantize(self.t.raw.dtype, b, out)
            .map_err(|e| Rows::error(self.pack, self.t, e.to_string()))
    }
}

/// Whether config.json states the model tied, and where that was read.
fn tied(pack: &Pack) -> (bool, String) {
    match pack.text.get("tie_word_embeddings").and_then(Json::as_bool) {
        Some(b) => (b, format!("{CONFIG} tie_word_embeddings {b}")),
        // transformers' PretrainedConfig: tie_word_embeddings defaults to true.
        None => (
            true,
            format!("{CONFIG} states no tie_word_embeddings; transformers' default is true"),
        ),
    }
}

fn tie_test(pack: &Pack) -> Result<Tie> {
    let (is_tied, source) = tied(pack);
    if !is_tied {
        return Ok(Tie::NotChecked(format!("the model is not tied ({source})")));
    }
    let (Some(out), Some(emb)) = (
        pack.by_gguf("output.weight"),
        pack.by_gguf("token_embd.weight"),
    ) else {
        return Ok(Tie::NotChecked(
            "the pack lacks an output matrix or an embedding to compare".into(),
        ));
    };
    if out.raw.dims != emb.raw.dims {
        return Ok(Tie::NotChecked(format!(
            "{} {:?} and {} {:?} differ in shape",
            out.pack_name, out.raw.dims, emb.pack_name, emb.raw.dims
        )));
    }
    // Pearson correlation over every value, rows decoded side by side.
    let (ro, re) = (Rows::new(pack, out)?, Rows::new(pack, emb)?);
    let k = out.raw.dims[0] as usize;
    let (mut x, mut y) = (vec![0f32; k], vec![0f32; k]);
    let [mut sx, mut sy, mut sxx, mut syy, mut sxy] = [0f64; 5];
    for r in 0..ro.n {
        ro.decode(r, &mut x)?;
        re.decode(r, &mut y)?;
        for (&p, &q) in x.iter().zip(&y) {
            let (p, q) = (p as f64, q as f64);
            sx += p;
            sy += q;
            sxx += p * p;
            syy += q * q;
            sxy += p * q;
        }
    }
    let n = (ro.n * k) as f64;
    let cov = sxy / n - (sx / n) * (sy / n);
    let vx = sxx / n - (sx / n).powi(2);
    let vy = syy / n - (sy / n).powi(2);
    Ok(Tie::Checked {
        output: out.pack_name.clone(),
        embedding: emb.pack_name.clone(),
        correlation: cov / (vx * vy).sqrt(),
        values: ro.n * k,
        source,
    })
}

/// Runs the checks over an open pack.
pub fn verify(pack: &Pack) -> Result<Report> {
    let mut matrices = Vec::new();
    for t in pack.tensors.iter().filter(|t| tiled(t)) {
        let rows = Rows::new(pack, t)?;
        let mut v = vec![0f32; t.raw.dims[0] as usize];
        let mut finite_rows = 0;
        for r in 0..rows.n {
            rows.decode(r, &mut v)?;
            finite_rows += v.iter().all(|x| x.is_finite()) as usize;
        }
        // Tensors read out of one stored tensor (gpt-oss's merged experts)
        // are told apart by the GGUF name they are read as.
        let shared = pack
            .tensors
            .iter()
            .filter(|u| u.pack_name == t.pack_name)
            .count()
            > 1;
        matrices.push(MatrixCheck {
            pack_name: if shared {
                format!("{} as {}", t.pack_name, t.gguf_name)
            } else {
                t.pack_name.clone()
            },
            form: t.form,
            rows: rows.n,
            finite_rows,
        });
    }
    let mut layout = match super::own_layout(pack.family) {
        Some(own) => (own.verify)(pack)?,
        None => Vec::new(),
    };
    let hidden = pack
        .text
        .get("hidden_size")
        .and_then(Json::as_u64)
        .map(|h| h as usize);
    layout.extend(super::vision::verify(pack.dir(), hidden)?);
    Ok(Report {
        matrices,
        tie: tie_test(pack)?,
        layout,
    })
}
