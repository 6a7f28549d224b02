//! `Logits::Hidden`: the final normed hidden states that embeddings pool.
//! Multiplied by the fixture's output matrix in f64 here, they give
//! llama.cpp's logits (so they are the rows llama.cpp multiplies, not some
//! other intermediate); and a batch mixing Hidden and logit sequences gives
//! each exactly what it gets alone.

use onebit_formats::gguf::Gguf;
use onebit_kernels::kv::KvType;
use onebit_kernels::Precision;
use onebit_model::{load, ExecConfig, Logits, SeqInput};
use onebit_testdata::{compare, Fixture};

fn exec() -> ExecConfig {
    ExecConfig {
        threads: 2,
        precision: Precision::Float,
        max_context: 128,
        kv_type: KvType::F32,
    }
}

#[test]
fn hidden_rows_times_the_output_matrix_are_llamacpps_logits() {
    let fx = Fixture::new("llama");
    let file = fx.dir.join("f32.gguf");
    let toks = fx.tokens("tokens");
    let (model, _) = load::load(&file, &exec()).unwrap();
    let e = model.sem.dims.n_embd;
    let v = fx.n_vocab();
    let hidden = model
        .forward(&mut model.new_state(), &toks, Logits::Hidden)
        .unwrap();
    assert_eq!(hidden.len(), toks.len() * e);

    let g = Gguf::open(&file).unwrap();
    let w = g
        .tensor("output.weight")
        .or_else(|| g.tensor("token_embd.weight"))
        .unwrap();
    assert_eq!(
        w.dims,
        [e as u64, v as u64],
        "an f32 [n_vocab][n_embd] matrix"
    );
    let bytes = g.tensor_bytes(w);
    let w: Vec<f32> = bytes
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect();
    let logits: Vec<f32> = hidden
        .chunks_exact(e)
        .flat_map(|h| {
            w.chunks_exact(e).map(move |row| {
                row.iter()
                    .zip(h)
                    .map(|(&a, &b)| f64::from(a) * f64::from(b))
                    .sum::<f64>() as f32
            })
        })
        .collect();
    let c = compare(
        &logits,
        &fx.logits("f32.logits.bin"),
        v,
        &fx.top1_margin("f32"),
    );
    let m = fx.max_abs_logit("f32");
    eprintln!(
        "hidden x output vs llama.cpp: max|diff| {:.3e} = {:.2e} M",
        c.max_abs_diff,
        c.max_abs_diff / m
    );
    assert!(c.max_abs_diff <= 1e-4 * m, "{c:?}");
}

#[test]
fn a_batch_mixing_hidden_and_logits_gives_each_what_it_gets_alone() {
    let fx = Fixture::new("llama");
    let toks = fx.tokens("tokens");
    let (model, _) = load::load(&fx.dir.join("f32.gguf"), &exec()).unwrap();
    let alone_h = model
        .forward(&mut model.new_state(), &toks, Logits::Hidden)
        .unwrap();
    let alone_l = model
        .forward(&mut model.new_state(), &toks[..3], Logits::All)
        .unwrap();
    let (mut a, mut b, mut c) = (model.new_state(), model.new_state(), model.new_state());
    let out = model
        .forward_batch(&mut [
            SeqInput {
                state: &mut a,
                tokens: &toks[..3],
                want: Logits::All,
            },
            SeqInput {
                state: &mut b,
                tokens: &toks,
                want: Logits::Hidden,
            },
            SeqInput {
                state: &mut c,
                tokens: &toks[..2],
                want: Logits::None,
            },
        ])
        .unwrap();
    assert_eq!(out[0], alone_l);
    assert_eq!(out[1], alone_h);
    assert!(out[2].is_empty());
}
