//! Products of a weight matrix (any block format) with a batch of activation rows.
//!
//! `Precision::Quantized` is llama.cpp's scheme: each activation row is
//! quantized once per matmul into the encoding the weight type's dot product
//! consumes (Q8_0, Q8_1 or Q8_K), then integer block dot products.
//! `Precision::Float` dequantizes each weight row and keeps activations in f32:
//! slower, and exact to the weights' decoded values (the reference path).
//!
//! Each output element is one `dot` call over one weight row and one activation
//! row, whatever the batch size, so batched and one-at-a-time results agree
//! bit for bit.

use onebit_formats::{blocks, ByteView, GgmlType};

use crate::pool::Pool;
use crate::quant::{self, ActFormat};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Precision {
    /// Activations quantized per block, integer dot products (fast; llama.cpp's scheme).
    #[default]
    Quantized,
    /// Weights dequantized to f32, f32 activations (reference).
    Float,
}

/// A weight matrix of `rows` outputs by `cols` inputs, rows stored one after another.
#[derive(Clone, Debug)]
pub struct QMatrix {
    pub dtype: GgmlType,
    pub rows: usize,
    pub cols: usize,
    pub data: ByteView,
}

impl QMatrix {
    /// Checks that `data` holds exactly rows x cols elements of `dtype`.
    pub fn new(
        dtype: GgmlType,
        rows: usize,
        cols: usize,
        data: ByteView,
    ) -> Result<QMatrix, String> {
        let rb = dtype
            .row_bytes(cols as u64)
            .ok_or_else(|| format!("row length {cols} is not a whole number of {dtype} blocks"))?;
        let want = rb.checked_mul(rows as u64).ok_or("size overflows")?;
        if want != data.len() as u64 {
            return Err(format!(
                "{rows}x{cols} {dtype} needs {want} bytes, found {}",
                data.len()
            ));
        }
        Ok(QMatrix {
            dtype,
            rows,
            cols,
            data,
        })
    }

    pub fn row_bytes(&self) -> usize {
        self.data.len() / self.rows
    }

    pub fn row(&self, r: usize) -> &[u8] {
        let rb = self.row_bytes();
        &self.data[r * rb..(r + 1) * rb]
    }

    /// Decodes row `r` into `out` (cols values).
    pub fn dequantize_row(&self, r: usize, out: &mut [f32]) {
        blocks::dequantize(self.dtype, self.row(r), out)
            .expect("QMatrix rows are whole blocks, checked at construction");
    }

    fn act_format(&self, precision: Precision) -> ActFormat {
        match precision {
            Precision::Quantized => quant::act_format(self.dtype),
            Precision::Float => ActFormat::F32,
        }
    }
}

/// `out[t][r] = sum_k w[r][k] * x[t][k]` for `n_tok` rows of `x` ([n_tok][cols]);
/// `out` is [n_tok][rows].
pub fn matmul(
    pool: &Pool,
    precision: Precision,
    w: &QMatrix,
    x: &[f32],
    n_tok: usize,
    out: &mut [f32],
) {
    assert_eq!(x.len(), n_tok * w.cols, "matmul input shape");
    assert_eq!(out.len(), n_tok * w.rows, "matmul output shape");
    let fmt = w.act_format(precision);
    let arb = quant::act_row_bytes(fmt, w.cols);
    let mut acts = vec![0u8; arb * n_tok];
    for (t, a) in acts.chunks_exact_mut(arb).enumerate() {
        quant::quantize_act(fmt, &x[t * w.cols..(t + 1) * w.cols], a);
    }
    let dequant = precision == Precision::Float && w.dtype != GgmlType::F32;
    // Each range of weight rows is computed for every token into its own
    // buffer ([rows in range][n_tok]) and scattered afterwards.
    let parts = pool.map_ranges(w.rows, 16, |range| {
        let mut buf = vec![0f32; range.len() * n_tok];
        let mut wrow = vec![0f32; if dequant { w.cols } else { 0 }];
        let mut wbytes = vec![0u8; if dequant { w.cols * 4 } else { 0 }];
        for (i, r) in range.clone().enumerate() {
            let row: &[u8] = if dequant {
                w.dequantize_row(r, &mut wrow);
                for (b, v) in wbytes.chunks_exact_mut(4).zip(&wrow) {
                    b.copy_from_slice(&v.to_le_bytes());
                }
                &wbytes
            } else {
                w.row(r)
            };
            let wt = if dequant { GgmlType::F32 } else { w.dtype };
            for t in 0..n_tok {
                buf[i * n_tok + t] = quant::dot(wt, row, &acts[t * arb..(t + 1) * arb], w.cols);
            }
        }
        (range, buf)
    });
    for (range, buf) in parts {
        for (i, r) in range.enumerate() {
            for t in 0..n_tok {
                out[t * w.rows + r] = buf[i * n_tok + t];
            }
        }
    }
}
