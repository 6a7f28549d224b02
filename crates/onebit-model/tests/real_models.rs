//! The two real models (fetched by scripts/fetch-models.sh; these tests fail
//! when they are missing): batched prefill equals one token at a time, bit for
//! bit, with the quantized-activation kernels the CLI uses.

use onebit_model::{load, ExecConfig, Logits};
use onebit_testdata::{real_model, GEMMA3_270M, SMOLLM2_135M};

fn batch_equals_sequential(file: &str, ids: &[u32]) {
    let exec = ExecConfig {
        threads: 2,
        ..Default::default()
    };
    let (model, _) = load::load(&real_model(file), &exec).unwrap();
    let mut st = model.new_state();
    let batch = model.forward(&mut st, ids, Logits::All).unwrap();
    let mut st = model.new_state();
    let mut seq = Vec::with_capacity(batch.len());
    for &id in ids {
        seq.extend(model.forward(&mut st, &[id], Logits::Last).unwrap());
    }
    let n_vocab = model.sem.dims.n_vocab;
    for (t, (a, b)) in batch.chunks(n_vocab).zip(seq.chunks(n_vocab)).enumerate() {
        let differing = a
            .iter()
            .zip(b)
            .filter(|(x, y)| x.to_bits() != y.to_bits())
            .count();
        assert_eq!(
            differing, 0,
            "{file}: position {t}: {differing} logits differ between batch and sequential"
        );
    }
}

#[test]
fn gemma3_270m_batch_equals_sequential() {
    // "The capital of France is Paris. The capital of Germany is" (the first six
    // ids are llama.cpp's for "The capital of France is" in testdata/refs, the
    // rest the vocabulary's ▁Paris . ▁The ▁capital ▁of ▁Germany ▁is), then
    // llama.cpp's ids for "line one\nline two\n\nline four" without BOS.
    let ids = [
        2, 818, 5279, 529, 7001, 563, 9079, 236761, 669, 5279, 529, 9405, 563, 1257, 886, 107,
        1257, 1156, 108, 1257, 2390,
    ];
    batch_equals_sequential(GEMMA3_270M, &ids);
}

#[test]
fn smollm2_135m_batch_equals_sequential() {
    // "The capital of France is" + "line one\nline two\n\nline four" (testdata/refs).
    let ids = [
        504, 3575, 282, 4649, 314, 1311, 582, 198, 1311, 827, 198, 198, 1311, 1876,
    ];
    batch_equals_sequential(SMOLLM2_135M, &ids);
}
