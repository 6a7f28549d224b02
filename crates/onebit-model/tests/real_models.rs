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
    assert_eq!(
        batch.len(),
        ids.len() * n_vocab,
        "{file}: one row per token"
    );
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

#[test]
fn smollm2_135m_long_prompt_in_micro_batches_equals_sequential() {
    // 300 tokens: `forward` runs them as micro-batches of 128, 128 and 44
    // (the leading ones without logits); every row must still be the
    // one-token-at-a-time result, and `Last` the last of them.
    let mut z = 12345u64;
    let ids: Vec<u32> = (0..300)
        .map(|_| {
            z = z.wrapping_mul(6364136223846793005).wrapping_add(1);
            ((z >> 33) % 49152) as u32
        })
        .collect();
    batch_equals_sequential(SMOLLM2_135M, &ids);

    let exec = ExecConfig {
        threads: 2,
        ..Default::default()
    };
    let (model, _) = load::load(&real_model(SMOLLM2_135M), &exec).unwrap();
    let n_vocab = model.sem.dims.n_vocab;
    let mut all_st = model.new_state();
    let all = model.forward(&mut all_st, &ids, Logits::All).unwrap();
    let mut last_st = model.new_state();
    let last = model.forward(&mut last_st, &ids, Logits::Last).unwrap();
    assert_eq!(last, all[(ids.len() - 1) * n_vocab..]);
    // The state a logit-less micro-batch leaves is the same as with logits.
    let next = [ids[7]];
    assert_eq!(
        model.forward(&mut all_st, &next, Logits::Last).unwrap(),
        model.forward(&mut last_st, &next, Logits::Last).unwrap()
    );
    let mut none_st = model.new_state();
    assert!(model
        .forward(&mut none_st, &ids[..20], Logits::None)
        .unwrap()
        .is_empty());
    assert_eq!(none_st.pos, 20);
}
