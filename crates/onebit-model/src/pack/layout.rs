//! Storage layouts of packs whose converter does more than rename and tile:
//! FastFlowLM's MoE packs (`q4nx/models/qwen35moe.py`) store some tensors
//! with rows or column groups reordered, some transposed, expert stacks
//! flattened to 2-D, the experts in Q4_1 full tiles of shape
//! [N/32, Kp/256, 5120] and every other quantized matrix in wide Q8 tiles
//! ([N/32, Kp/256, 8704]). A family declares this as a [`PackLayout`] in its
//! own file ([`of`] lists them); the importer applies each tensor's [`Op`]s
//! in order (GGUF -> stored) and the reader their inverses in reverse order,
//! so the invariant is: read(import(t)) has the GGUF tensor's dims and
//! values, up to the tile type's rounding.

use onebit_formats::{blocks, GgmlType};
use serde_json::Value as Json;

use crate::families::{self, Family};

/// One storage transform, stated in the GGUF -> stored direction.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Op {
    /// Rows reordered: stored row i is GGUF row `perm[i]` (a 1-D tensor's
    /// rows are its elements).
    Rows(Vec<usize>),
    /// Column chunks of `unit` columns reordered: stored chunk j is GGUF
    /// chunk `perm[j]`.
    Cols { unit: usize, perm: Vec<usize> },
    /// Stored transposed (\[N\]\[K\] becomes \[K\]\[N\]); float tensors only.
    Transpose,
}

/// A layout resolved against one model's config.json.
pub struct Layout {
    /// (GGUF name pattern with `{i}`, its ops GGUF -> stored).
    pub ops: Vec<(&'static str, Vec<Op>)>,
    /// Tiled matrices whose input width is not the hidden size.
    pub widths: Vec<(&'static str, usize)>,
    /// Experts per stack ([`PackLayout::experts`]).
    pub n_expert: usize,
}

/// What a family's converter does to its tensors' storage.
pub struct PackLayout {
    /// Where the layout is read (the converter's file).
    pub source: &'static str,
    /// Expert stacks: GGUF [K, rows, E], stored as one [E * rows, K] matrix.
    pub experts: &'static [&'static str],
    /// Quantized matrices stored as Q4_1 full tiles; every other quantized
    /// matrix is stored in wide Q8 tiles.
    pub q4: &'static [&'static str],
    /// Tensors stored BF16 whatever their GGUF type (the converter's policy).
    pub bf16: &'static [&'static str],
    /// Tensors stored F32.
    pub f32: &'static [&'static str],
    /// The ops and widths for a config.json (text root); an error names the
    /// key at fault.
    pub resolve: fn(&Json) -> Result<Layout, (String, String)>,
}

/// The families whose packs have a layout (declared in their files).
pub fn of(family: &Family) -> Option<&'static PackLayout> {
    match family.arch {
        "qwen35moe" => Some(&families::qwen35moe::PACK_LAYOUT),
        _ => None,
    }
}

/// Whether `name` (a GGUF name) fits a pattern with at most one `{i}`.
pub fn fits(pattern: &str, name: &str) -> bool {
    match pattern.split_once("{i}") {
        None => pattern == name,
        Some((pre, post)) => name
            .strip_prefix(pre)
            .and_then(|m| m.strip_suffix(post))
            .is_some_and(|m| !m.is_empty() && m.bytes().all(|b| b.is_ascii_digit())),
    }
}

pub fn listed(patterns: &[&str], name: &str) -> bool {
    patterns.iter().any(|p| fits(p, name))
}

impl Layout {
    pub fn ops_of(&self, name: &str) -> &[Op] {
        self.ops
            .iter()
            .find(|(p, _)| fits(p, name))
            .map_or(&[], |(_, o)| o.as_slice())
    }
    pub fn width_of(&self, name: &str) -> Option<usize> {
        self.widths
            .iter()
            .find(|(p, _)| fits(p, name))
            .map(|&(_, w)| w)
    }
}

/// A tensor in ggml terms: dims innermost first, bytes in `dtype`.
#[derive(Clone, Debug, PartialEq)]
pub struct Plain {
    pub dtype: GgmlType,
    pub dims: Vec<u64>,
    pub bytes: Vec<u8>,
}

fn float_bytes(dtype: GgmlType) -> Option<usize> {
    match dtype {
        GgmlType::F32 => Some(4),
        GgmlType::F16 | GgmlType::BF16 => Some(2),
        _ => None,
    }
}

/// The inverse of a permutation.
pub fn inverse(perm: &[usize]) -> Vec<usize> {
    let mut inv = vec![0; perm.len()];
    for (i, &p) in perm.iter().enumerate() {
        inv[p] = i;
    }
    inv
}

impl Plain {
    /// As f32 (exact for every float type and every ggml block type's values).
    pub fn to_f32(&self) -> Result<Plain, String> {
        let n: u64 = self.dims.iter().product();
        let mut v = vec![0f32; n as usize];
        blocks::dequantize(self.dtype, &self.bytes, &mut v).map_err(|e| e.to_string())?;
        Ok(Plain {
            dtype: GgmlType::F32,
            dims: self.dims.clone(),
            bytes: v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        })
    }

    /// Rows and the bytes of one.
    fn rows(&self) -> Result<(usize, usize), String> {
        if self.dims.len() == 1 {
            let e = float_bytes(self.dtype)
                .ok_or_else(|| format!("a {} vector cannot be reordered", self.dtype))?;
            return Ok((self.dims[0] as usize, e));
        }
        let rb = self.dtype.row_bytes(self.dims[0]).ok_or_else(|| {
            format!(
                "a row of {} is not whole {} blocks",
                self.dims[0], self.dtype
            )
        })? as usize;
        Ok((self.dims[1..].iter().product::<u64>() as usize, rb))
    }

    /// Applies one op (GGUF -> stored); a column reorder that would split a
    /// quantization block is done on the f32 values (dtype becomes F32).
    pub fn apply(&self, op: &Op) -> Result<Plain, String> {
        match op {
            Op::Rows(perm) => {
                let (n, rb) = self.rows()?;
                if perm.len() != n {
                    return Err(format!("{n} rows, but the layout reorders {}", perm.len()));
                }
                let mut out = Vec::with_capacity(self.bytes.len());
                for &p in perm {
                    out.extend_from_slice(&self.bytes[p * rb..(p + 1) * rb]);
                }
                Ok(Plain {
                    bytes: out,
                    ..self.clone()
                })
            }
            Op::Cols { unit, perm } => {
                let k = self.dims[0] as usize;
                if self.dims.len() != 2 || unit * perm.len() != k {
                    return Err(format!(
                        "{:?}: the layout reorders {} chunks of {unit} columns",
                        self.dims,
                        perm.len()
                    ));
                }
                let (elems, bytes_per) = match float_bytes(self.dtype) {
                    Some(e) => (1, e),
                    None => (self.dtype.block_len(), self.dtype.block_bytes()),
                };
                if !unit.is_multiple_of(elems) {
                    return self.to_f32()?.apply(op);
                }
                let chunk = unit / elems * bytes_per;
                let (_, rb) = self.rows()?;
                let mut out = Vec::with_capacity(self.bytes.len());
                for row in self.bytes.chunks_exact(rb) {
                    for &p in perm {
                        out.extend_from_slice(&row[p * chunk..(p + 1) * chunk]);
                    }
                }
                Ok(Plain {
                    bytes: out,
                    ..self.clone()
                })
            }
            Op::Transpose => {
                let e = float_bytes(self.dtype)
                    .ok_or_else(|| format!("a {} matrix cannot be transposed", self.dtype))?;
                if self.dims.len() != 2 {
                    return Err(format!("{:?} is not a matrix to transpose", self.dims));
                }
                let (k, n) = (self.dims[0] as usize, self.dims[1] as usize);
                let mut out = vec![0u8; self.bytes.len()];
                for r in 0..n {
                    for c in 0..k {
                        let (s, d) = ((r * k + c) * e, (c * n + r) * e);
                        out[d..d + e].copy_from_slice(&self.bytes[s..s + e]);
                    }
                }
                Ok(Plain {
                    dtype: self.dtype,
                    dims: vec![n as u64, k as u64],
                    bytes: out,
                })
            }
        }
    }

    /// Undoes one op (stored -> GGUF).
    pub fn undo(&self, op: &Op) -> Result<Plain, String> {
        match op {
            Op::Rows(perm) => self.apply(&Op::Rows(inverse(perm))),
            Op::Cols { unit, perm } => self.apply(&Op::Cols {
                unit: *unit,
                perm: inverse(perm),
            }),
            Op::Transpose => self.apply(&Op::Transpose),
        }
    }

    /// Every op in order (GGUF -> stored).
    pub fn store(self, ops: &[Op]) -> Result<Plain, String> {
        ops.iter().try_fold(self, |t, op| t.apply(op))
    }

    /// Every op undone in reverse order (stored -> GGUF).
    pub fn restore(self, ops: &[Op]) -> Result<Plain, String> {
        ops.iter().rev().try_fold(self, |t, op| t.undo(op))
    }
}

/// llama.cpp's V-head order undone: its converter tiles the V heads of a
/// linear-attention layer (\[r\]\[k\] for r = n_v / n_k heads per key head), HF
/// and FastFlowLM keep them grouped by key head (\[k\]\[r\]). Stored unit
/// (ki * r + ri) is GGUF unit (ri * n_k + ki); each unit spans `unit` rows.
pub fn v_heads_grouped(n_k: usize, n_v: usize, unit: usize) -> Vec<usize> {
    let r = n_v / n_k;
    let mut perm = Vec::with_capacity(n_v * unit);
    for ki in 0..n_k {
        for ri in 0..r {
            for u in 0..unit {
                perm.push((ri * n_k + ki) * unit + u);
            }
        }
    }
    perm
}

/// The identity on `n` rows followed by `tail` shifted past them.
pub fn after(n: usize, tail: Vec<usize>) -> Vec<usize> {
    (0..n).chain(tail.into_iter().map(|p| p + n)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f32s(dims: &[u64], v: &[f32]) -> Plain {
        Plain {
            dtype: GgmlType::F32,
            dims: dims.to_vec(),
            bytes: v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        }
    }

    fn vals(p: &Plain) -> Vec<f32> {
        p.bytes
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
            .collect()
    }

    /// Two key heads with two V heads each: GGUF (tiled) order is
    /// [k0v0, k1v0, k0v1, k1v1], the grouped order [k0v0, k0v1, k1v0, k1v1].
    #[test]
    fn v_heads_go_back_to_grouped_order() {
        assert_eq!(v_heads_grouped(2, 4, 1), vec![0, 2, 1, 3]);
        assert_eq!(v_heads_grouped(2, 4, 2), vec![0, 1, 4, 5, 2, 3, 6, 7]);
        assert_eq!(v_heads_grouped(3, 3, 1), vec![0, 1, 2]);
        assert_eq!(after(2, vec![1, 0]), vec![0, 1, 3, 2]);
    }

    #[test]
    fn ops_undo_exactly_and_transpose_moves_elements() {
        let t = f32s(&[3, 2], &[1., 2., 3., 4., 5., 6.]);
        let tr = t.apply(&Op::Transpose).unwrap();
        assert_eq!(tr.dims, vec![2, 3]);
        assert_eq!(vals(&tr), vec![1., 4., 2., 5., 3., 6.]);
        let ops = vec![
            Op::Rows(vec![1, 0]),
            Op::Cols {
                unit: 1,
                perm: vec![2, 0, 1],
            },
            Op::Transpose,
        ];
        let s = t.clone().store(&ops).unwrap();
        // Rows swapped: [4 5 6 | 1 2 3]; columns (2, 0, 1): [6 4 5 | 3 1 2].
        assert_eq!(vals(&s), vec![6., 3., 4., 1., 5., 2.]);
        assert_eq!(s.restore(&ops).unwrap(), t);
    }

    /// Column chunks narrower than a Q8_0 block are moved on the f32 values.
    #[test]
    fn a_column_reorder_inside_a_block_goes_through_f32() {
        let v: Vec<f32> = (0..64).map(|i| i as f32).collect();
        let q = onebit_formats::q4nx::quantize_q8_0_bf16(&v);
        let t = Plain {
            dtype: GgmlType::Q8_0,
            dims: vec![64, 1],
            bytes: q,
        };
        let perm: Vec<usize> = (0..4).rev().collect();
        let s = t.apply(&Op::Cols { unit: 16, perm }).unwrap();
        assert_eq!(s.dtype, GgmlType::F32);
        let want = vals(&t.to_f32().unwrap());
        let got = vals(&s);
        assert_eq!(&got[0..16], &want[48..64]);
        assert_eq!(&got[48..64], &want[0..16]);
        // Whole blocks move as blocks.
        let s = t
            .apply(&Op::Cols {
                unit: 32,
                perm: vec![1, 0],
            })
            .unwrap();
        assert_eq!(s.dtype, GgmlType::Q8_0);
        assert_eq!(&s.bytes[..34], &t.bytes[34..]);
    }
}
