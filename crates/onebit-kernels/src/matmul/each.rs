//! Several products, each over its own input, in one pool dispatch: what a
//! mixture-of-experts layer runs (every chosen expert's gate and up over
//! the tokens routed to it, then every expert's down over its own
//! activations).
//!
//! Invariant: every output equals, bit for bit, what [`matmul`] gives for
//! the same matrix and input (the same activation encoding and layout for
//! that matrix and token count, the same kernel), whatever the other
//! products of the call. Each input is quantized once, however many
//! matrices read it (gate and up of one expert share their activations).

use super::*;

/// One product of [`matmul_each`]: `out = w · inputs[input]`, `out` being
/// \[n_tok\]\[w.rows\] for the input's `n_tok` rows.
pub struct Product<'a> {
    pub w: &'a QMatrix,
    pub input: usize,
    pub out: &'a mut [f32],
}

/// An input of [`matmul_each`]: `n_tok` rows of `x.len() / n_tok` values.
#[derive(Clone, Copy)]
pub struct Input<'a> {
    pub x: &'a [f32],
    pub n_tok: usize,
}

/// Runs every product; the rows of all products are cut into chunks that
/// the pool's threads share in one dispatch (one synchronization for the
/// whole set, not one per matrix). An input read by matrices of different
/// activation encodings is encoded once per encoding. Falls back to one
/// [`matmul`] per product where there is no SIMD kernel (the same bits
/// either way).
pub fn matmul_each(pool: &Pool, precision: Precision, inputs: &[Input], products: &mut [Product]) {
    for p in products.iter() {
        let inp = inputs[p.input];
        assert_eq!(inp.x.len(), inp.n_tok * p.w.cols, "matmul_each input shape");
        assert_eq!(
            p.out.len(),
            inp.n_tok * p.w.rows,
            "matmul_each output shape"
        );
    }
    #[cfg(target_arch = "x86_64")]
    if shared_path(pool, precision, inputs, products) {
        return;
    }
    for p in products.iter_mut() {
        let inp = inputs[p.input];
        matmul(pool, precision, p.w, inp.x, inp.n_tok, p.out);
    }
}

/// The one-dispatch path; false (nothing computed) when it does not apply.
#[cfg(target_arch = "x86_64")]
fn shared_path(
    pool: &Pool,
    precision: Precision,
    inputs: &[Input],
    products: &mut [Product],
) -> bool {
    if precision != Precision::Quantized {
        return false;
    }
    let isa = Isa::best();
    // The encodings: (input, format, layout, cols), each made once however
    // many products read it; `enc[j]` is product j's.
    let mut encodings: Vec<(usize, ActFormat, ActLayout, usize)> = Vec::new();
    let mut enc = vec![usize::MAX; products.len()];
    for (j, p) in products.iter().enumerate() {
        let n_tok = inputs[p.input].n_tok;
        if n_tok == 0 || p.w.rows == 0 {
            continue;
        }
        if x86::gemm_fn(isa, p.w.dtype).is_none() {
            return false;
        }
        let want = (
            p.input,
            p.w.act_format(precision),
            act_layout(p.w, precision, n_tok),
            p.w.cols,
        );
        enc[j] = match encodings.iter().position(|&x| x == want) {
            Some(i) => i,
            None => {
                encodings.push(want);
                encodings.len() - 1
            }
        };
    }
    with_scratch(|sc| {
        // Each encoding's rows one after another in `all` (with the pad
        // quantize_rows leaves after them): (offset, bytes per row).
        let mut all = std::mem::take(&mut sc.each);
        all.clear();
        let mut at: Vec<(usize, usize)> = Vec::with_capacity(encodings.len());
        for &(i, fmt, layout, cols) in &encodings {
            let arb = quantize_rows(pool, fmt, layout, inputs[i].x, cols, inputs[i].n_tok, sc);
            at.push((all.len(), arb));
            all.extend_from_slice(&sc.acts);
        }
        // The chunks: (product, first row, end row).
        let threads = pool.threads();
        let mut chunks: Vec<(usize, usize, usize)> = Vec::new();
        for (j, p) in products.iter().enumerate() {
            let n_tok = inputs[p.input].n_tok;
            if n_tok == 0 || p.w.rows == 0 {
                continue;
            }
            let layout = encodings[enc[j]].2;
            // Repacked copies made now, not inside the dispatch below.
            kernel_rows(p.w, pool, layout);
            let per = chunk_rows(
                p.w.rows,
                threads,
                chunks_per_thread(n_tok >= wide_from(p.w.dtype)),
            );
            let mut r0 = 0;
            while r0 < p.w.rows {
                chunks.push((j, r0, (r0 + per).min(p.w.rows)));
                r0 += per;
            }
        }
        let dsts: Vec<OutPtr> = products
            .iter_mut()
            .map(|p| OutPtr(p.out.as_mut_ptr()))
            .collect();
        let (all_ref, dsts, chunks, products) = (&all[..], &dsts, &chunks, &*products);
        let (encodings, enc, at) = (&encodings, &enc, &at);
        pool.for_each_chunk(chunks.len(), |c| {
            let (j, r0, r1) = chunks[c];
            let p = &products[j];
            let (layout, (off, arb)) = (encodings[enc[j]].2, at[enc[j]]);
            let wrb = p.w.row_bytes();
            let ops = Operands {
                w: &kernel_rows(p.w, pool, layout)[r0 * wrb..],
                wrb,
                a: &all_ref[off..],
                arb,
                cols: p.w.cols,
            };
            let d = dsts[j];
            // SAFETY: products[j].out has n_tok * rows elements (asserted in
            // matmul_each); this chunk writes exactly out[t * rows + r] for
            // r in r0..r1, t < n_tok, which no other chunk touches (the
            // chunks of one product cover disjoint rows, and the products'
            // outputs are distinct &mut slices); the outputs are borrowed
            // for the whole call.
            unsafe {
                x86::gemm(
                    isa,
                    p.w.dtype,
                    layout == ActLayout::Wide,
                    &ops,
                    r1 - r0,
                    inputs[p.input].n_tok,
                    d.0.add(r0),
                    p.w.rows,
                )
            };
        });
        sc.each = all;
    });
    true
}

#[cfg(test)]
mod tests {
    use super::super::tests::matrix;
    use super::*;

    /// Every product equals `matmul` of its matrix and input, bit for bit,
    /// for inputs of 1, 3 and 9 tokens (one-token, packed and wide
    /// kernels) read by one or several matrices, mixed types included.
    #[test]
    fn each_product_equals_its_own_matmul() {
        let pool = Pool::new(2);
        let cols = 512;
        let ws = [
            matrix(GgmlType::Q4_0, 40, cols, 11),
            matrix(GgmlType::Q4_0, 40, cols, 12),
            matrix(GgmlType::Q4K, 24, cols, 13),
            matrix(GgmlType::Q8_0, 17, cols, 14),
            matrix(GgmlType::Q6K, 9, cols, 15),
            // Q5_K, as the experts of Q4_K_M / Q5_K_M MoE files carry it.
            matrix(GgmlType::Q5K, 19, cols, 16),
        ];
        let xs: Vec<Vec<f32>> = [1usize, 3, 9, 2, 20]
            .iter()
            .enumerate()
            .map(|(s, &n)| {
                (0..n * cols)
                    .map(|i| (((i + 31 * s) * 7919) % 997) as f32 / 498.0 - 1.0)
                    .collect()
            })
            .collect();
        let n_toks = [1usize, 3, 9, 2, 20];
        // (matrix, input): gate/up pairs sharing an input, a K-quant alone,
        // then the same input read by types of different encodings.
        let plans: [&[(usize, usize)]; 3] = [
            &[(0, 0), (1, 0), (0, 1), (1, 1), (2, 2), (3, 2), (4, 3)],
            &[(0, 0), (2, 0), (3, 1)],
            // Q5_K experts: one token, a few (the few-row kernel) and 20
            // (the wide kernel), beside Q4_K and Q6_K on the same input.
            &[
                (5, 0),
                (5, 1),
                (5, 2),
                (2, 2),
                (4, 2),
                (5, 3),
                (5, 4),
                (2, 4),
            ],
        ];
        for plan in plans {
            let inputs: Vec<Input> = xs
                .iter()
                .zip(n_toks)
                .map(|(x, n_tok)| Input { x, n_tok })
                .collect();
            let mut got: Vec<Vec<f32>> = plan
                .iter()
                .map(|&(m, i)| vec![0f32; n_toks[i] * ws[m].rows])
                .collect();
            {
                let mut products: Vec<Product> = plan
                    .iter()
                    .zip(got.iter_mut())
                    .map(|(&(m, i), out)| Product {
                        w: &ws[m],
                        input: i,
                        out,
                    })
                    .collect();
                matmul_each(&pool, Precision::Quantized, &inputs, &mut products);
            }
            for (&(m, i), g) in plan.iter().zip(&got) {
                let mut want = vec![0f32; n_toks[i] * ws[m].rows];
                matmul(
                    &pool,
                    Precision::Quantized,
                    &ws[m],
                    &xs[i],
                    n_toks[i],
                    &mut want,
                );
                let same = g.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits());
                assert!(same, "matrix {m} over input {i}: differs from matmul");
                assert!(
                    want.iter().any(|v| *v != 0.0),
                    "matrix {m}: a zero product proves nothing"
                );
            }
        }
    }
}
