//! Sequence state is one value: snapshot, decode, restore, decode again gives
//! the same logits bit for bit, in every family (the hybrids' conv and
//! recurrent states included). Several sequences in one batched call get
//! exactly what each gets alone. Both for every KV cache type the model's
//! head size allows.

use onebit_kernels::kv::KvType;
use onebit_kernels::Precision;
use onebit_model::{load, ExecConfig, Logits, Model, SeqInput};
use onebit_testdata::Fixture;

/// Every registered family (each has a fixture under testdata/llamacpp/).
fn families() -> impl Iterator<Item = &'static str> {
    onebit_model::families::FAMILIES.iter().map(|f| f.arch)
}

fn model(family: &str) -> Model {
    model_kv(family, KvType::F32).expect("f32 KV loads")
}

/// The family's quantized fixture with `kv` caches; None when its head
/// size cannot hold them (q8_0 blocks of 32).
fn model_kv(family: &str, kv: KvType) -> Option<Model> {
    let fx = Fixture::new(family);
    let exec = ExecConfig {
        threads: 2,
        precision: Precision::Quantized,
        max_context: 128,
        kv_type: kv,
    };
    match load::load(&fx.dir.join(format!("{}.gguf", fx.quant())), &exec) {
        Ok((m, _)) => Some(m),
        Err(e) if kv == KvType::Q8_0 && e.to_string().contains("KV type q8_0") => None,
        Err(e) => panic!("{family} {kv}: {e}"),
    }
}

/// Every (family, KV type) the fixtures can run.
fn models() -> impl Iterator<Item = (&'static str, KvType, Model)> {
    families().flat_map(|family| {
        KvType::ALL
            .into_iter()
            .filter_map(move |kv| model_kv(family, kv).map(|m| (family, kv, m)))
    })
}

fn decode(m: &Model, st: &mut onebit_model::SeqState, ids: &[u32]) -> Vec<u32> {
    ids.iter()
        .flat_map(|&t| m.forward(st, &[t], Logits::Last).unwrap())
        .map(f32::to_bits)
        .collect()
}

#[test]
fn snapshot_restore_replays_the_same_logits_in_every_family() {
    for (family, kv, m) in models() {
        let toks = Fixture::new(family).tokens("tokens");
        let family = &format!("{family} {kv}");
        let (first, rest) = toks.split_at(12);
        let mut st = m.new_state();
        decode(&m, &mut st, first);
        let snap = st.snapshot();
        let a = decode(&m, &mut st, &rest[..10]);
        st.restore(&snap);
        let b = decode(&m, &mut st, &rest[..10]);
        assert_eq!(a, b, "{family}: replay after restore differs");

        // reset gives a fresh sequence: the same logits as a new state.
        st.reset();
        let c = decode(&m, &mut st, &first[..4]);
        let mut fresh = m.new_state();
        assert_eq!(
            c,
            decode(&m, &mut fresh, &first[..4]),
            "{family}: reset is not a fresh state"
        );
    }
}

#[test]
fn restoring_matters_for_recurrent_state() {
    // Without the restore, the hybrids' conv/recurrent states (not only the
    // position) carry the extra tokens: the replay must differ.
    for family in ["lfm2", "qwen35"] {
        let m = model(family);
        let toks = Fixture::new(family).tokens("tokens");
        let mut st = m.new_state();
        decode(&m, &mut st, &toks[..8]);
        let snap = st.snapshot();
        let a = decode(&m, &mut st, &toks[8..12]);
        let mut stale = snap.clone();
        // the same position, but every non-attention state taken from after the decode
        for (l, after) in stale.layers.iter_mut().zip(&st.layers) {
            if !matches!(l, onebit_model::state::LayerState::Attention(_)) {
                *l = after.clone();
            }
        }
        let b = decode(&m, &mut stale, &toks[8..12]);
        assert_ne!(a, b, "{family}: recurrent state had no effect");
    }
}

#[test]
fn batched_sequences_get_what_each_gets_alone() {
    for (family, kv, m) in models() {
        let toks = Fixture::new(family).tokens("tokens");
        let family = &format!("{family} {kv}");
        let (a_ids, b_ids) = (&toks[..9], &toks[20..33]);
        let alone = |ids: &[u32]| {
            let mut st = m.new_state();
            m.forward(&mut st, ids, Logits::All).unwrap()
        };
        let (mut sa, mut sb) = (m.new_state(), m.new_state());
        let out = m
            .forward_batch(&mut [
                SeqInput {
                    state: &mut sa,
                    tokens: a_ids,
                    want: Logits::All,
                },
                SeqInput {
                    state: &mut sb,
                    tokens: b_ids,
                    want: Logits::Last,
                },
            ])
            .unwrap();
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&out[0]), bits(&alone(a_ids)), "{family}: sequence a");
        let lb = alone(b_ids);
        assert_eq!(
            bits(&out[1]),
            bits(&lb[lb.len() - out[1].len()..]),
            "{family}: sequence b"
        );
        // and a decode step for both together continues each one exactly
        let (na, nb) = (toks[9], toks[33]);
        let step = m
            .forward_batch(&mut [
                SeqInput {
                    state: &mut sa,
                    tokens: &[na],
                    want: Logits::Last,
                },
                SeqInput {
                    state: &mut sb,
                    tokens: &[nb],
                    want: Logits::Last,
                },
            ])
            .unwrap();
        let mut ea: Vec<u32> = a_ids.to_vec();
        ea.push(na);
        let la = alone(&ea);
        assert_eq!(
            bits(&step[0]),
            bits(&la[la.len() - step[0].len()..]),
            "{family}: decode a"
        );
    }
}

#[test]
fn gemma4_shared_kv_layers_store_no_kv_of_their_own() {
    // Layers 5 and 6 read layers 3 and 4's caches (fixture README): their
    // own caches have rows of width 0, so nothing is stored or reserved.
    let m = model("gemma4");
    let mut st = m.new_state();
    m.forward(&mut st, &[2, 17, 99, 250], Logits::Last).unwrap();
    let widths: Vec<(usize, usize)> = st
        .layers
        .iter()
        .map(|l| match l {
            onebit_model::state::LayerState::Attention(c) => (c.k.width(), c.k.rows()),
            other => panic!("gemma4 layers are attention layers, found {other:?}"),
        })
        .collect();
    // k widths: n_head_kv (2) x head size (16 sliding, 32 full).
    assert_eq!(
        widths,
        [(32, 4), (32, 4), (64, 4), (32, 4), (64, 4), (0, 0), (0, 0)],
        "{widths:?}"
    );
}

/// gemma4-a4b's caches hold each kind's KV heads (fixture README): 2 of 16
/// on sliding layers, 1 of 32 on full ones (whose V is their K), so every
/// row is 32 wide; layers 5 and 6 read layers 3 and 4's.
#[test]
fn gemma4_a4b_kv_caches_hold_each_kinds_kv_heads() {
    let m = model("gemma4-a4b");
    let mut st = m.new_state();
    m.forward(&mut st, &[2, 17, 99], Logits::Last).unwrap();
    let widths: Vec<(usize, usize, usize)> = st
        .layers
        .iter()
        .map(|l| match l {
            onebit_model::state::LayerState::Attention(c) => (c.k.width(), c.v.width(), c.v.rows()),
            other => panic!("gemma4 layers are attention layers, found {other:?}"),
        })
        .collect();
    let own = (32, 32, 3);
    assert_eq!(
        widths,
        [own, own, own, own, own, (0, 0, 0), (0, 0, 0)],
        "{widths:?}"
    );
    let sem = &m.sem;
    assert_eq!(sem.kv_heads(onebit_model::semantics::LayerKind::Sliding), 2);
    assert_eq!(sem.kv_heads(onebit_model::semantics::LayerKind::Full), 1);
}

/// `bytes_at(n)` (what a server budgets a full context with) is what a
/// state holds after running `n` positions, in every family and KV type:
/// the fixed recurrent states counted once, the attention rows per position.
#[test]
fn bytes_at_n_positions_is_what_a_state_holds_after_n_tokens() {
    for (family, kv, m) in models() {
        let toks = Fixture::new(family).tokens("tokens");
        let fresh = m.new_state();
        let mut st = m.new_state();
        assert_eq!(fresh.bytes_at(0), st.bytes(), "{family} {kv}");
        m.forward(&mut st, &toks[..8], Logits::Last).unwrap();
        assert_eq!(fresh.bytes_at(8), st.bytes(), "{family} {kv}: after 8");
        m.forward(&mut st, &toks[8..9], Logits::Last).unwrap();
        assert_eq!(fresh.bytes_at(9), st.bytes(), "{family} {kv}: after 9");
    }
}
