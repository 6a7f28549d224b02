//! gpt-oss packs as FastFlowLM's converter lays them out
//! (`q4nx/models/gpt_oss.py` with `configs/gpt-oss.json`), made by the
//! importer from the gpt-oss fixture and read back: the stored bytes follow
//! the converter's layout (every offset below computed here from its
//! einops patterns and packers, not by our writer or reader); the pack
//! reads back to the GGUF's weights (MXFP4 experts bit for bit, Q4_1 scales
//! and minimums and float tensors through bf16) and gives the GGUF's
//! logits; `verify` passes it and names what a damaged one breaks; what the
//! layout cannot hold is refused by name.

mod common;

use std::collections::BTreeMap;

use common::{
    bf, bf16_at, drop_tensor, gpt_oss_20b_meta, import_err, import_pack, logits, rewrite,
    rounded_q4_1,
};
use half::{bf16, f16};
use onebit_formats::gguf::writer::GgufWriter;
use onebit_formats::gguf::Gguf;
use onebit_formats::q4nx::TileForm;
use onebit_formats::safetensors::{SafeTensors, StDtype, StOut};
use onebit_formats::{blocks, GgmlType};
use onebit_model::pack::{import, verify, Form, Pack};
use onebit_model::{load, Semantics};
use onebit_testdata::{compare, Fixture, TempDir};

fn import_with(gguf: &std::path::Path, dir: &std::path::Path) -> Vec<String> {
    import_pack(gguf, dir, import::ImportOptions::default())
}

/// The fixture's sizes (meta.json hparams).
struct Sizes {
    h: usize,
    n_head: usize,
    n_kv: usize,
    hd: usize,
    e: usize,
    ff: usize,
    vocab: usize,
    layers: usize,
}

fn sizes(fx: &Fixture) -> Sizes {
    let p = &fx.meta["hparams"];
    let u = |k: &str| p[k].as_u64().unwrap_or_else(|| panic!("hparams.{k}")) as usize;
    Sizes {
        h: u("n_embd"),
        n_head: u("n_head"),
        n_kv: u("n_head_kv"),
        hd: u("head_dim"),
        e: u("n_expert"),
        ff: u("n_ff_exp"),
        vocab: u("n_vocab"),
        layers: u("n_layer"),
    }
}

/// A GGUF tensor's values (row-major, rows of dims[0]).
fn gguf_values(g: &Gguf, name: &str) -> Vec<f32> {
    let t = g.tensor(name).unwrap_or_else(|| panic!("{name}"));
    let mut v = vec![0f32; t.n_elements() as usize];
    blocks::dequantize(t.dtype, &g.tensor_bytes(t), &mut v).unwrap();
    v
}

fn round_up(x: usize, m: usize) -> usize {
    x.div_ceil(m) * m
}

/// A Q4 matrix stored as the converter writes it, decoded by its layout:
/// `_pack_q4nx` with 32-row, 128-column blocks and `keep_block_in_2D`
/// ("(p r) (q c) -> p q (c r)" for scales and minimums, codes "p q (g c r)"
/// with rows (g, r, b): byte 512 + (r/16)*1024 + c*8 + (r%16)/2, even rows
/// low), then tile row p of the [P, Q, 2560] tensor moved to [p / group][q]
/// [p % group] (`post_gpt_oss_process`'s "(row_div_four four_row)", lm_head's
/// "(row_div_two two_row)"). Returns the n x k values and, separately, every
/// byte of the stored tensor that is padding (tile rows past n, columns past k).
fn q4_stored(b: &[u8], n: usize, k: usize, group: usize) -> (Vec<f32>, Vec<u8>) {
    let kb = k.div_ceil(128);
    let tile = |p: usize, q: usize| ((p / group) * kb + q) * group + p % group;
    let mut v = vec![0f32; n * k];
    for row in 0..n {
        for col in 0..k {
            let t = &b[tile(row / 32, col / 128) * 2560..][..2560];
            let (r, c) = (row % 32, col % 128);
            let si = 2 * ((c / 32) * 32 + r);
            let byte = t[512 + (r / 16) * 1024 + c * 8 + (r % 16) / 2];
            let q = if r % 2 == 0 { byte & 15 } else { byte >> 4 };
            v[row * k + col] = bf16_at(t, si) * q as f32 + bf16_at(t, 256 + si);
        }
    }
    let mut pad = Vec::new();
    let tiles = b.len() / 2560;
    for ti in 0..tiles {
        let (p, q, m) = (ti / (kb * group), (ti / group) % kb, ti % group);
        let rb = p * group + m;
        let t = &b[ti * 2560..][..2560];
        if rb * 32 >= n {
            pad.extend_from_slice(t);
            continue;
        }
        // Columns past k in the last tile column: their scales, minimums, codes.
        for c in 0..128 {
            if q * 128 + c < k {
                continue;
            }
            for r in 0..32 {
                if c % 32 == 0 {
                    let si = 2 * ((c / 32) * 32 + r);
                    pad.extend_from_slice(&t[si..si + 2]);
                    pad.extend_from_slice(&t[256 + si..256 + si + 2]);
                }
                let byte = t[512 + (r / 16) * 1024 + c * 8 + (r % 16) / 2];
                pad.push(if r % 2 == 0 { byte & 15 } else { byte >> 4 });
            }
        }
    }
    (v, pad)
}

/// Every stored tensor of an imported MXFP4_MOE fixture is where and what
/// the converter puts it: the names of `configs/gpt-oss.json`; the experts'
/// MXFP4 exponents and codes bit for bit in the MXFP4 tiles with each row
/// block's biases after the exponents, gate and up interleaved by 4 tile
/// rows then down; the router in 32 x 64 blocks of column-major 16-row
/// tiles and row-major padded; q/k/v/o and lm_head in grouped half tiles
/// within one Q4_1 step of the GGUF's Q8_0 values; every padding byte zero.
#[test]
fn gpt_oss_pack_bytes_follow_the_converters_layout() {
    let fx = Fixture::new("gpt-oss");
    let s = sizes(&fx);
    let gguf = fx.dir.join("MXFP4_MOE.gguf");
    let g = Gguf::open(&gguf).unwrap();
    let tmp = TempDir::new("pack-oss-layout");
    let notes = import_with(&gguf, tmp.path());
    eprintln!("{notes:#?}");
    let st = SafeTensors::open(tmp.path().join("model.q4nx")).unwrap();
    let bytes = |n: &str| {
        let t = st
            .tensor(n)
            .unwrap_or_else(|| panic!("{n} not in the pack"));
        (t.dtype, t.shape.clone(), st.bytes(t).to_vec())
    };
    let (h, q_rows, kv_rows) = (s.h, s.n_head * s.hd, s.n_kv * s.hd);

    // The names: the converter's name map, the merged experts, the router copy.
    let mut want_names: Vec<String> = [
        "model.embed_tokens.weight",
        "model.norm.weight",
        "lm_head.weight",
    ]
    .map(String::from)
    .to_vec();
    for il in 0..s.layers {
        for n in [
            "input_layernorm.weight",
            "post_attention_layernorm.weight",
            "self_attn.q_proj.weight",
            "self_attn.q_proj.bias",
            "self_attn.k_proj.weight",
            "self_attn.k_proj.bias",
            "self_attn.v_proj.weight",
            "self_attn.v_proj.bias",
            "self_attn.o_proj.weight",
            "self_attn.o_proj.bias",
            "self_attn.sinks.weight",
            "mlp.router.weight",
            "mlp.router.weight_prefill",
            "mlp.router.bias",
            "mlp.experts.gate_proj_bias",
            "mlp.experts.up_proj_bias",
            "mlp.experts.down_proj_bias",
            "ffn_gate_up_down_exps.weight",
        ] {
            want_names.push(format!("model.layers.{il}.{n}"));
        }
    }
    let mut names: Vec<String> = st.tensors.iter().map(|t| t.name.clone()).collect();
    want_names.sort();
    names.sort();
    assert_eq!(names, want_names);

    let mut checked = 0usize;
    for il in 0..s.layers {
        let p = |n: &str| format!("model.layers.{il}.{n}");
        let b = |n: &str| format!("blk.{il}.{n}");

        // Experts: [E, 2 Rg + Rd, Kb, 4, 2560] U8; Rg, Rd groups of 4 tile
        // rows after padding each expert to a multiple of 4 tile rows.
        let rg = round_up(s.ff / 32, 4) / 4;
        let rd = round_up(h / 32, 4) / 4;
        let kb = h.div_ceil(128);
        assert_eq!(kb, s.ff.div_ceil(128));
        let (dt, shape, x) = bytes(&p("ffn_gate_up_down_exps.weight"));
        assert_eq!(dt, StDtype::U8);
        assert_eq!(
            shape,
            vec![s.e as u64, (2 * rg + rd) as u64, kb as u64, 4, 2560]
        );
        let mut covered = vec![false; x.len()];
        for (part, (gn, bn, n, k)) in [
            ("ffn_gate_exps.weight", "ffn_gate_exps.bias", s.ff, h),
            ("ffn_up_exps.weight", "ffn_up_exps.bias", s.ff, h),
            ("ffn_down_exps.weight", "ffn_down_exps.bias", h, s.ff),
        ]
        .into_iter()
        .enumerate()
        {
            let gt = g.tensor(&b(gn)).unwrap();
            assert_eq!(gt.dtype, GgmlType::MXFP4);
            let gb = g.tensor_bytes(gt);
            let bias = gguf_values(&g, &b(bn));
            for e in 0..s.e {
                for rb in 0..round_up(n / 32, 4) {
                    // "e s r c m b -> e (r s) c m b": gate group r at 2r,
                    // up at 2r + 1; then down's groups after 2 Rg.
                    let grp = if part < 2 {
                        2 * (rb / 4) + part
                    } else {
                        2 * rg + rb / 4
                    };
                    for cb in 0..kb {
                        let at = ((e * (2 * rg + rd) + grp) * kb + cb) * 4 * 2560 + (rb % 4) * 2560;
                        let t = &x[at..at + 2560];
                        covered[at..at + 2560].iter_mut().for_each(|c| *c = true);
                        if rb * 32 >= n {
                            assert!(t.iter().all(|&v| v == 0), "{} pad tile row {rb}", gn);
                            continue;
                        }
                        // Bytes 128..512: the row block's biases in its first
                        // tile (bytes 128 + 2r), zero elsewhere.
                        for r in 0..32 {
                            let v = bf16_at(t, 128 + 2 * r);
                            if cb == 0 {
                                assert_eq!(
                                    v,
                                    bf(bias[e * n + rb * 32 + r]),
                                    "{gn} bias {e} {rb} {r}"
                                );
                            } else {
                                assert_eq!(v, 0.0);
                            }
                        }
                        assert!(t[192..512].iter().all(|&v| v == 0), "{gn} reserved bytes");
                        for r in 0..32 {
                            let row = rb * 32 + r;
                            for c in 0..128 {
                                let col = cb * 128 + c;
                                let exp = t[(c / 32) * 32 + r];
                                let byte = t[512 + (r / 16) * 1024 + c * 8 + (r % 16) / 2];
                                let code = if r % 2 == 0 { byte & 15 } else { byte >> 4 };
                                if col >= k {
                                    assert_eq!((exp, code), (0, 0), "{gn} pad column {col}");
                                    continue;
                                }
                                // GGUF block (e, row, col / 32): byte 0 the
                                // exponent, byte 1 + j element j low, j + 16 high.
                                let blk = &gb[((e * n + row) * (k / 32) + col / 32) * 17..][..17];
                                let j = col % 32;
                                let want = if j < 16 {
                                    blk[1 + j] & 15
                                } else {
                                    blk[1 + j - 16] >> 4
                                };
                                assert_eq!((exp, code), (blk[0], want), "{gn} e{e} ({row}, {col})");
                            }
                        }
                        checked += 1;
                    }
                }
            }
        }
        assert!(
            covered.iter().all(|&c| c),
            "every expert byte is placed by the formula"
        );

        // Router: BF16 [Eb Hb, 128, 16]; element (i, j) at
        // ((i/32) Hb + j/64) 2048 + (((i%32)/16) 64 + j%64) 16 + i%16.
        let w = gguf_values(&g, &b("ffn_gate_inp.weight"));
        let (dt, shape, x) = bytes(&p("mlp.router.weight"));
        let (eb, hb) = (s.e.div_ceil(32), h.div_ceil(64));
        assert_eq!(dt, StDtype::BF16);
        assert_eq!(shape, vec![(eb * hb) as u64, 128, 16]);
        for i in 0..eb * 32 {
            for j in 0..hb * 64 {
                let at =
                    ((i / 32) * hb + j / 64) * 2048 + (((i % 32) / 16) * 64 + j % 64) * 16 + i % 16;
                let want = if i < s.e && j < h {
                    bf(w[i * h + j])
                } else {
                    0.0
                };
                assert_eq!(bf16_at(&x, 2 * at), want, "router ({i}, {j})");
            }
        }
        // Its prefill copy: row-major [E, ceil(H/128) 128], zero-padded.
        let (dt, shape, x) = bytes(&p("mlp.router.weight_prefill"));
        let hp = round_up(h, 128);
        assert_eq!((dt, shape), (StDtype::BF16, vec![s.e as u64, hp as u64]));
        for i in 0..s.e {
            for j in 0..hp {
                let want = if j < h { bf(w[i * h + j]) } else { 0.0 };
                assert_eq!(bf16_at(&x, 2 * (i * hp + j)), want);
            }
        }

        // q/k/v/o: tile rows padded to 16, grouped by 4.
        for (gn, pn, n, k) in [
            ("attn_q.weight", "self_attn.q_proj.weight", q_rows, h),
            ("attn_k.weight", "self_attn.k_proj.weight", kv_rows, h),
            ("attn_v.weight", "self_attn.v_proj.weight", kv_rows, h),
            ("attn_output.weight", "self_attn.o_proj.weight", h, q_rows),
        ] {
            let (dt, shape, x) = bytes(&p(pn));
            assert_eq!(dt, StDtype::I8);
            let kb = k.div_ceil(128);
            assert_eq!(
                shape,
                vec![(round_up(n / 32, 16) / 4) as u64, kb as u64, 4, 2560],
                "{pn}"
            );
            let (v, pad) = q4_stored(&x, n, k, 4);
            assert!(pad.iter().all(|&b| b == 0), "{pn}: padding not zero");
            within_a_q4_1_step(&v, &gguf_values(&g, &b(gn)), pn);
            checked += 1;
        }

        // Float tensors: BF16 in HF shape.
        for (gn, pn) in [
            ("attn_norm.weight", "input_layernorm.weight"),
            (
                "post_attention_norm.weight",
                "post_attention_layernorm.weight",
            ),
            ("attn_q.bias", "self_attn.q_proj.bias"),
            ("attn_k.bias", "self_attn.k_proj.bias"),
            ("attn_v.bias", "self_attn.v_proj.bias"),
            ("attn_output.bias", "self_attn.o_proj.bias"),
            ("attn_sinks.weight", "self_attn.sinks.weight"),
            ("ffn_gate_inp.bias", "mlp.router.bias"),
            ("ffn_gate_exps.bias", "mlp.experts.gate_proj_bias"),
            ("ffn_up_exps.bias", "mlp.experts.up_proj_bias"),
            ("ffn_down_exps.bias", "mlp.experts.down_proj_bias"),
        ] {
            let (dt, shape, x) = bytes(&p(pn));
            let gt = g.tensor(&b(gn)).unwrap();
            assert_eq!(dt, StDtype::BF16, "{pn}");
            assert_eq!(
                shape,
                gt.dims.iter().rev().copied().collect::<Vec<_>>(),
                "{pn}"
            );
            let w = gguf_values(&g, &b(gn));
            for (i, &y) in w.iter().enumerate() {
                assert_eq!(bf16_at(&x, 2 * i), bf(y), "{pn}[{i}]");
            }
        }
    }
    // lm_head: half tiles grouped by 2.
    let (dt, shape, x) = bytes("lm_head.weight");
    assert_eq!(dt, StDtype::I8);
    assert_eq!(
        shape,
        vec![
            (round_up(s.vocab / 32, 2) / 2) as u64,
            h.div_ceil(128) as u64,
            2,
            2560
        ]
    );
    let (v, pad) = q4_stored(&x, s.vocab, h, 2);
    assert!(pad.iter().all(|&b| b == 0), "lm_head padding");
    within_a_q4_1_step(&v, &gguf_values(&g, "output.weight"), "lm_head");
    let (dt, shape, x) = bytes("model.embed_tokens.weight");
    assert_eq!((dt, shape), (StDtype::BF16, vec![s.vocab as u64, h as u64]));
    let w = gguf_values(&g, "token_embd.weight");
    assert!(w
        .iter()
        .enumerate()
        .all(|(i, &y)| bf16_at(&x, 2 * i) == bf(y)));
    eprintln!("{checked} tiles and matrices checked by the layout's formulas");
}

/// Re-quantized Q4_1 values within one min-max step of their group of 32
/// (the importer fits scale and minimum by least squares, so a weight can
/// sit further than half a step from its code; never a whole step).
fn within_a_q4_1_step(got: &[f32], want: &[f32], name: &str) {
    for (gi, (x, y)) in got.chunks(32).zip(want.chunks(32)).enumerate() {
        let (lo, hi) = y
            .iter()
            .fold((f32::MAX, f32::MIN), |(l, u), &a| (l.min(a), u.max(a)));
        let step = (hi - lo) / 15.0;
        for (a, b) in x.iter().zip(y) {
            assert!(
                (a - b).abs() <= step * 1.0001,
                "{name} group {gi}: {a} vs {b}, step {step}"
            );
        }
    }
}

/// ggml's reference Q4_1 quantizer (`quantize_row_q4_1_ref`): per block of
/// 32, d = (max - min) / 15, m = min, q = min(15, (x - min) / d + 0.5), d
/// and m stored as f16.
fn q4_1_ref(x: &[f32]) -> Vec<u8> {
    let mut out = Vec::new();
    for blk in x.chunks_exact(32) {
        let (min, max) = blk
            .iter()
            .fold((f32::MAX, f32::MIN), |(l, u), &a| (l.min(a), u.max(a)));
        let d = (max - min) / 15.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        out.extend_from_slice(&f16::from_f32(d).to_le_bytes());
        out.extend_from_slice(&f16::from_f32(min).to_le_bytes());
        for j in 0..16 {
            let q = |v: f32| (((v - min) * id + 0.5) as u8).min(15);
            out.push(q(blk[j]) | (q(blk[j + 16]) << 4));
        }
    }
    out
}

/// The MXFP4_MOE fixture with its Q8_0 matrices (q/k/v/o, output)
/// quantized to Q4_1 by ggml's reference quantizer: the GGUF the converter
/// takes (FastFlowLM's are Q4_1 GGUFs with MXFP4 experts).
fn q4_1_gguf(fx: &Fixture, tmp: &TempDir) -> std::path::PathBuf {
    let g = Gguf::open(fx.dir.join("MXFP4_MOE.gguf")).unwrap();
    let mut w = GgufWriter::from_gguf(&g);
    for t in &g.tensors {
        if t.dtype == GgmlType::Q8_0 && t.name != "token_embd.weight" {
            w.set_tensor(
                &t.name,
                &t.dims,
                GgmlType::Q4_1,
                q4_1_ref(&gguf_values(&g, &t.name)),
            );
        }
    }
    tmp.file("q4_1.gguf", &w.to_bytes())
}

/// The pack of a Q4_1 GGUF with MXFP4 experts, read back: every tensor has
/// its GGUF dims and exactly the GGUF's values, except what the format
/// rounds: Q4_1 scales and minimums (f16 in the GGUF) through bf16, and
/// every F32 tensor (embedding, norms, sinks, biases, router) through bf16;
/// MXFP4 experts are bit for bit. The semantics restate the GGUF's; the
/// GGUF rewritten with those roundings gives the pack's logits bit for bit;
/// the pack's logits follow the GGUF's within the fixture README's bound
/// for a quantized engine; `verify` passes.
#[test]
fn gpt_oss_pack_reads_back_to_the_gguf_weights_and_logits() {
    let fx = Fixture::new("gpt-oss");
    let tmp = TempDir::new("pack-oss-read");
    let gguf = q4_1_gguf(&fx, &tmp);
    let g = Gguf::open(&gguf).unwrap();
    let dir = tmp.path().join("pack");
    let notes = import_with(&gguf, &dir);
    eprintln!("{notes:#?}");
    assert!(
        !notes.iter().any(|n| n.contains("re-quantized")),
        "{notes:?}"
    );
    let pack = Pack::open(&dir).unwrap();
    assert!(pack.unmapped.is_empty(), "{:?}", pack.unmapped);
    let census = pack.census().join("\n");
    eprintln!("{census}");
    assert!(
        census.contains("I8 Q4 half tiles (32 x 128), asymmetric"),
        "{census}"
    );
    assert!(census.contains("U8 MXFP4 tiles"), "{census}");
    let mut rounded = BTreeMap::new();
    let mut w = GgufWriter::from_gguf(&g);
    for t in &g.tensors {
        let p = pack
            .by_gguf(&t.name)
            .unwrap_or_else(|| panic!("{} not read", t.name));
        assert_eq!(p.raw.dims, t.dims, "{}", t.name);
        let src = g.tensor_bytes(t);
        let want: Vec<u8> = match t.dtype {
            GgmlType::MXFP4 => src.to_vec(),
            GgmlType::Q4_1 => rounded_q4_1(&src),
            GgmlType::F32 | GgmlType::Q8_0 => gguf_values(&g, &t.name)
                .iter()
                .flat_map(|&x| bf16::from_f32(x).to_le_bytes())
                .collect(),
            d => panic!("{}: {d:?}", t.name),
        };
        let changed = if t.dtype == GgmlType::Q4_1 {
            want.chunks(20)
                .zip(src.chunks(20))
                .filter(|(a, b)| a[..4] != b[..4])
                .count()
        } else if t.dtype == GgmlType::MXFP4 {
            0
        } else {
            let v = gguf_values(&g, &t.name);
            v.iter().filter(|&&x| bf(x) != x).count()
        };
        *rounded.entry(format!("{:?}", t.dtype)).or_insert(0usize) += changed;
        assert!(p.raw.bytes[..] == want[..], "{}: read back differs", t.name);
        w.set_tensor(&t.name, &t.dims, p.raw.dtype, want);
    }
    eprintln!("values the format rounds (Q4_1: blocks whose scale or minimum moved): {rounded:?}");

    let gs = load::open(&gguf).unwrap().sem;
    let ps = load::open(&dir).unwrap().sem;
    assert_same_attention(&gs, &ps);
    assert_eq!(gs.attn_sinks.value, ps.attn_sinks.value);
    assert_eq!(gs.attn_bias.value, ps.attn_bias.value);
    assert_eq!(gs.activation.value, ps.activation.value);
    let (gm, pm) = (
        &gs.moe.as_ref().unwrap().value,
        &ps.moe.as_ref().unwrap().value,
    );
    assert_eq!(
        (
            gm.n_expert,
            gm.n_used,
            gm.n_ff_exp,
            gm.gating.value,
            gm.norm_weights.value
        ),
        (
            pm.n_expert,
            pm.n_used,
            pm.n_ff_exp,
            pm.gating.value,
            pm.norm_weights.value
        )
    );
    assert_eq!(gm.expert_biases.value, pm.expert_biases.value);
    eprintln!(
        "pack semantics: {} / {}",
        ps.layer_kinds.source, ps.rope_full.source
    );

    let r = verify::verify(&pack).unwrap();
    assert!(r.failures().is_empty(), "{:?}", r.failures());
    assert!(r.matrices.iter().any(|m| m.form == Form::Mx));
    assert!(
        r.layout.len() >= 4 && r.layout[..4].iter().all(|c| c.values > 0),
        "{:?}",
        r.layout
    );

    let ids = fx.tokens("tokens");
    let nv = fx.n_vocab();
    let got = logits(&dir, &ids);
    let same = tmp.file("as-pack.gguf", &w.to_bytes());
    assert!(
        logits(&same, &ids) == got,
        "the pack's logits differ from its weights' in a GGUF"
    );
    let base = logits(&gguf, &ids);
    let m = base.iter().fold(0f32, |a, x| a.max(x.abs()));
    let margins = top1_margins(&base, nv);
    let c = compare(&got, &base, nv, &margins);
    eprintln!("pack vs its Q4_1 GGUF: {c:?}, M {m}");
    // The fixture README's bound for a quantized engine against llama.cpp
    // (cosine >= 0.998, max |diff| <= 0.05 M, the argmax kept where the
    // margin is >= 0.5): bf16 rounding moves the weights less than that.
    assert!(c.min_cosine >= 0.998, "{c:?}");
    assert!(c.max_abs_diff <= 0.05 * m, "{c:?}");
    assert!(c.argmax_flips.iter().all(|&(_, mg)| mg < 0.5), "{c:?}");
}

/// A pack's sizes, layer kinds, window, both RoPEs and attention scale
/// (what its config.json restates) are the GGUF's.
fn assert_same_attention(gs: &Semantics, ps: &Semantics) {
    assert_eq!(gs.dims, ps.dims);
    assert_eq!(gs.layer_kinds.value, ps.layer_kinds.value);
    assert_eq!(gs.sliding_window.value, ps.sliding_window.value);
    assert_eq!(gs.rope_full.value, ps.rope_full.value);
    assert_eq!(gs.rope_sliding.value, ps.rope_sliding.value);
    assert_eq!(gs.attn_scale.value, ps.attn_scale.value);
}

/// The margin between the two largest logits at each position.
fn top1_margins(l: &[f32], nv: usize) -> Vec<f32> {
    l.chunks(nv)
        .map(|x| {
            let mut v = x.to_vec();
            v.sort_by(|a, b| b.total_cmp(a));
            v[0] - v[1]
        })
        .collect()
}

/// The default import of the MXFP4_MOE fixture (its Q8_0 q/k/v/o and
/// output re-quantized to Q4_1) runs within the README's bound for an
/// engine whose weights differ by a re-quantization: against the GGUF's
/// logits (onebit's), cosine >= 0.98 at every position and the argmax kept
/// wherever llama.cpp's margin is >= 1.0; `verify` passes.
#[test]
fn gpt_oss_default_import_follows_the_gguf_logits() {
    let fx = Fixture::new("gpt-oss");
    let gguf = fx.dir.join("MXFP4_MOE.gguf");
    let tmp = TempDir::new("pack-oss-default");
    let notes = import_with(&gguf, tmp.path());
    assert!(
        notes
            .iter()
            .any(|n| n.contains("Q8_0 matrices re-quantized to Q4_1")),
        "{notes:?}"
    );
    let pack = Pack::open(tmp.path()).unwrap();
    let r = verify::verify(&pack).unwrap();
    assert!(r.failures().is_empty(), "{:?}", r.failures());
    let ids = fx.tokens("tokens");
    let nv = fx.n_vocab();
    let base = logits(&gguf, &ids);
    let got = logits(tmp.path(), &ids);
    let margins = fx.top1_margin("MXFP4_MOE");
    let c = compare(&got, &base, nv, &margins);
    let reference = fx.logits("MXFP4_MOE.logits.bin");
    let cl = compare(&got, &reference, nv, &margins);
    eprintln!("default pack vs the GGUF (onebit): {c:?}\nvs llama.cpp's MXFP4_MOE logits: {cl:?}");
    for c in [&c, &cl] {
        assert!(c.min_cosine >= 0.98, "{c:?}");
        assert!(c.argmax_flips.iter().all(|&(_, mg)| mg < 1.0), "{c:?}");
    }
}

fn edit_config(dir: &std::path::Path, f: impl Fn(&mut serde_json::Value)) {
    let p = dir.join("config.json");
    let mut c: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap();
    f(&mut c);
    std::fs::write(&p, serde_json::to_string_pretty(&c).unwrap()).unwrap();
}

fn load_err(dir: &std::path::Path) -> String {
    match load::load(dir, &Default::default()) {
        Ok(_) => panic!("{}: loaded", dir.display()),
        Err(e) => e.to_string(),
    }
}

/// What the layout cannot read is refused by name: a missing tensor (the
/// sinks, the merged experts), a tile row width or grouping that is not the
/// converter's, a config.json value gpt-oss does not run (an unknown layer
/// type, a SwiGLU limit other than 7, YaRN betas or attention factor other
/// than llama.cpp's, an expert width the tiles do not hold).
#[test]
fn gpt_oss_pack_refusals_name_the_tensor_or_key() {
    let fx = Fixture::new("gpt-oss");
    let gguf = fx.dir.join("MXFP4_MOE.gguf");
    let fresh = |tag: &str| {
        let t = TempDir::new(tag);
        import_with(&gguf, t.path());
        t
    };
    // Missing tensors.
    let t = fresh("pack-oss-nosinks");
    drop_tensor(t.path(), "model.layers.1.self_attn.sinks.weight");
    let e = load_err(t.path());
    eprintln!("refused: {e}");
    assert!(
        e.contains("blk.1.attn_sinks.weight") || e.contains("sinks"),
        "{e}"
    );
    let t = fresh("pack-oss-noexps");
    drop_tensor(t.path(), "model.layers.2.ffn_gate_up_down_exps.weight");
    let e = load_err(t.path());
    eprintln!("refused: {e}");
    assert!(e.contains("blk.2.ffn_gate_exps.weight"), "{e}");
    // Tile sizes and groupings that are not the converter's.
    let t = fresh("pack-oss-width");
    let name = "model.layers.0.self_attn.q_proj.weight";
    rewrite(t.path(), name, |o| {
        o.shape = vec![o.shape[0], 1, 2, 5120];
    });
    let e = Pack::open(t.path()).err().expect("refused").to_string();
    eprintln!("refused: {e}");
    assert!(
        e.contains(name) && e.contains("2,560 bytes") && e.contains("[4, 1, 4, 2560]"),
        "{e}"
    );
    let t = fresh("pack-oss-group");
    rewrite(t.path(), name, |o| {
        o.shape = vec![o.shape[0] * 2, 1, 2, 2560];
    });
    let e = Pack::open(t.path()).err().expect("refused").to_string();
    eprintln!("refused: {e}");
    assert!(e.contains(name) && e.contains("grouped by 4"), "{e}");
    let t = fresh("pack-oss-exps");
    let name = "model.layers.3.ffn_gate_up_down_exps.weight";
    rewrite(t.path(), name, |o| {
        o.shape[4] = 1280;
        o.shape[3] = 8;
    });
    let e = Pack::open(t.path()).err().expect("refused").to_string();
    eprintln!("refused: {e}");
    assert!(
        e.contains(name) && e.contains("MXFP4 tiles of 2,560 bytes"),
        "{e}"
    );
    let t = fresh("pack-oss-router");
    let name = "model.layers.0.mlp.router.weight";
    rewrite(t.path(), name, |o| {
        o.shape = vec![32, 64];
    });
    let e = Pack::open(t.path()).err().expect("refused").to_string();
    eprintln!("refused: {e}");
    assert!(e.contains(name) && e.contains("32 x 64 blocks"), "{e}");

    // config.json values gpt-oss does not run.
    type Edit = fn(&mut serde_json::Value);
    let cases: [(&str, Edit, &str); 6] = [
        (
            "layer_types",
            |c| c["layer_types"][1] = "chunked_attention".into(),
            "chunked_attention",
        ),
        (
            "swiglu_limit",
            |c| c["swiglu_limit"] = 8.0.into(),
            "clamps at 7",
        ),
        (
            "rope_scaling.beta_fast",
            |c| c["rope_scaling"]["beta_fast"] = 16.0.into(),
            "beta_fast",
        ),
        (
            "rope_scaling.attention_factor",
            |c| c["rope_scaling"]["attention_factor"] = 1.2.into(),
            "magnitude factor",
        ),
        (
            "rope_scaling.rope_type",
            |c| c["rope_scaling"]["rope_type"] = "longrope".into(),
            "longrope",
        ),
        (
            "intermediate_size",
            |c| c["intermediate_size"] = 64.into(),
            "gate_proj_bias",
        ),
    ];
    for (key, edit, what) in cases {
        let t = fresh("pack-oss-key");
        edit_config(t.path(), edit);
        let e = load_err(t.path());
        eprintln!("refused: {e}");
        assert!(
            (e.contains(key) || e.contains(key.split('.').next_back().unwrap()))
                && e.contains(what),
            "{key}: {e}"
        );
    }
}

/// Imports that the layout cannot hold are refused by name: experts that
/// are not MXFP4 (the f32 fixture), --keep-q8, a forced tile form other
/// than the half tile, a GGUF rule HF's config.json keys cannot restate.
#[test]
fn gpt_oss_import_refusals_name_the_tensor_or_option() {
    let fx = Fixture::new("gpt-oss");
    let e = import_err(&fx.dir.join("f32.gguf"), Default::default());
    eprintln!("refused: {e}");
    assert!(
        e.contains("ffn_gate_exps.weight") && e.contains("MXFP4 experts only"),
        "{e}"
    );
    let q = fx.dir.join("MXFP4_MOE.gguf");
    let e = import_err(
        &q,
        import::ImportOptions {
            keep_q8: true,
            ..Default::default()
        },
    );
    eprintln!("refused: {e}");
    assert!(e.contains("--keep-q8") && e.contains("no Q8 tiles"), "{e}");
    let e = import_err(
        &q,
        import::ImportOptions {
            tiles: import::Tiles::Force(TileForm::Full),
            ..Default::default()
        },
    );
    eprintln!("refused: {e}");
    assert!(e.contains("--tiles") && e.contains("half tile"), "{e}");
    // A GGUF whose semantics HF's keys cannot restate: a sliding-layer base.
    let tmp = TempDir::new("pack-oss-swa-base");
    let mut w = GgufWriter::from_gguf(&Gguf::open(&q).unwrap());
    w.kv(
        "gpt-oss.rope.freq_base_swa",
        onebit_formats::gguf::Value::F32(10000.0),
    );
    let e = import_err(&tmp.file("swa.gguf", &w.to_bytes()), Default::default());
    eprintln!("refused: {e}");
    assert!(e.contains("cannot restate its sliding layers' RoPE"), "{e}");
}

/// `verify` names what a damaged pack breaks: a bias kept in an expert tile
/// that differs from the bias tensor, a non-zero byte in a padded tile row
/// of q_proj, a router copy that differs from the router.
#[test]
fn gpt_oss_verify_names_a_moved_bias_a_dirty_pad_and_a_router_copy() {
    let fx = Fixture::new("gpt-oss");
    let gguf = fx.dir.join("MXFP4_MOE.gguf");
    let s = sizes(&fx);
    type Damage = Box<dyn Fn(&mut StOut)>;
    let cases: [(&str, Damage, &str); 3] = [
        (
            "model.layers.1.ffn_gate_up_down_exps.weight",
            // Expert 0, up (group 1), tile row 0, first tile: bias of row 3.
            Box::new(|o: &mut StOut| o.data[2560 * 4 + 128 + 2 * 3 + 1] ^= 0x40),
            "expert biases",
        ),
        (
            "model.layers.0.self_attn.q_proj.weight",
            // The last tile: tile row 15, padding for q's 4 tile rows.
            Box::new(|o: &mut StOut| {
                let n = o.data.len();
                o.data[n - 7] = 1;
            }),
            "Q4 matrices",
        ),
        (
            "model.layers.2.mlp.router.weight_prefill",
            Box::new(move |o: &mut StOut| o.data[2 * (s.h + 5)] ^= 1),
            "router",
        ),
    ];
    for (name, edit, what) in cases {
        let t = TempDir::new("pack-oss-verify");
        import_with(&gguf, t.path());
        rewrite(t.path(), name, edit);
        let pack = Pack::open(t.path()).unwrap();
        let f = verify::verify(&pack).unwrap().failures();
        assert!(
            f.iter().any(|x| x.contains(what)) && f.iter().all(|x| x.contains(name)),
            "{name}: {f:?}"
        );
    }
}

/// gpt-oss-20b's published config.json (HF `GptOssConfig`, the file
/// FastFlowLM's pack carries; `quantization_config` left out) reads as the
/// semantics of the GGUF llama.cpp's converter makes of the same model: the
/// experts' width from `intermediate_size`, the layer kinds from
/// `layer_types`, YaRN from `rope_scaling` (its `truncate: false` noted:
/// llama.cpp floors and ceils the correction range regardless).
#[test]
fn gpt_oss_20b_config_json_reads_as_its_gguf() {
    let types: Vec<&str> = (0..24)
        .map(|i| {
            if i % 2 == 0 {
                "sliding_attention"
            } else {
                "full_attention"
            }
        })
        .collect();
    let config = serde_json::json!({
        "architectures": ["GptOssForCausalLM"],
        "attention_bias": true,
        "attention_dropout": 0.0,
        "eos_token_id": 200002,
        "experts_per_token": 4,
        "head_dim": 64,
        "hidden_act": "silu",
        "hidden_size": 2880,
        "initial_context_length": 4096,
        "initializer_range": 0.02,
        "intermediate_size": 2880,
        "layer_types": types,
        "max_position_embeddings": 131072,
        "model_type": "gpt_oss",
        "num_attention_heads": 64,
        "num_experts_per_tok": 4,
        "num_hidden_layers": 24,
        "num_key_value_heads": 8,
        "num_local_experts": 32,
        "output_router_logits": false,
        "pad_token_id": 199999,
        "rms_norm_eps": 1e-05,
        "rope_scaling": {
            "beta_fast": 32.0,
            "beta_slow": 1.0,
            "factor": 32.0,
            "original_max_position_embeddings": 4096,
            "rope_type": "yarn",
            "truncate": false
        },
        "rope_theta": 150000,
        "router_aux_loss_coef": 0.9,
        "sliding_window": 128,
        "swiglu_limit": 7.0,
        "tie_word_embeddings": false,
        "use_cache": true,
        "vocab_size": 201088
    });
    // The GGUF's metadata (gpt-oss-20b as llama.cpp's converter writes it).
    let w = gpt_oss_20b_meta(&[]);
    let tmp = TempDir::new("pack-oss-20b-config");
    let g = Gguf::open(tmp.file("m.gguf", &w.to_bytes())).unwrap();
    let gs = onebit_model::families::semantics_from_gguf(&g).unwrap();
    let family = onebit_model::families::by_arch("gpt-oss").unwrap();
    let dims = |n: &str| (n == "blk.0.attn_q.bias").then(|| vec![4096u64]);
    let d = onebit_model::families::decls::Decls::config(
        &config,
        std::path::Path::new("config.json"),
        family.arch,
        &dims,
    );
    let ps = (family.semantics)(&d).unwrap();
    // The GGUF of this sketch has no q bias tensor to find; the config's
    // attention_bias is true, as is gpt-oss-20b's GGUF's blk.0.attn_q.bias.
    assert!(ps.attn_bias.value);
    assert_same_attention(&gs, &ps);
    assert_eq!(gs.norm_eps.value, ps.norm_eps.value);
    let (gm, pm) = (
        &gs.moe.as_ref().unwrap().value,
        &ps.moe.as_ref().unwrap().value,
    );
    assert_eq!((gm.n_expert, gm.n_used, gm.n_ff_exp), (32, 4, 2880));
    assert_eq!((pm.n_expert, pm.n_used, pm.n_ff_exp), (32, 4, 2880));
    assert!(ps
        .moe
        .as_ref()
        .unwrap()
        .source
        .contains("intermediate_size"));
    assert!(ps.layer_kinds.source.contains("layer_types"));
    assert!(
        ps.rope_full.source.contains("truncate"),
        "{}",
        ps.rope_full.source
    );
    assert!(
        ps.activation.source.contains("swiglu_limit"),
        "{}",
        ps.activation.source
    );
}
