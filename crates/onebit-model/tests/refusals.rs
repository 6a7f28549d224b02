//! What a model declares and the forward does not implement is refused at
//! load, by name; so is a container that contradicts its own declarations.

use onebit_formats::gguf::writer::GgufWriter;
use onebit_formats::gguf::{Gguf, Value};
use onebit_formats::GgmlType;
use onebit_model::{load, ExecConfig};
use onebit_testdata::{Fixture, TempDir};

/// Loads an edited copy of a fixture's f32 GGUF; returns the error text.
fn load_variant(family: &str, edit: impl Fn(&mut GgufWriter)) -> Result<(), String> {
    let g = Gguf::open(Fixture::new(family).dir.join("f32.gguf")).unwrap();
    let mut w = GgufWriter::from_gguf(&g);
    edit(&mut w);
    let dir = TempDir::new("refusal");
    let p = dir.file("v.gguf", &w.to_bytes());
    load::load(&p, &ExecConfig::default())
        .map(|_| ())
        .map_err(|e| e.to_string())
}

/// An edited copy of a fixture's f32 GGUF is refused at load, the error
/// naming every one of `names`.
fn assert_refused(family: &str, names: &[&str], edit: impl Fn(&mut GgufWriter)) {
    let e = load_variant(family, edit).unwrap_err();
    assert!(names.iter().all(|n| e.contains(n)), "{names:?}: {e}");
}

#[test]
fn the_unedited_fixtures_load() {
    for family in onebit_model::families::FAMILIES.iter().map(|f| f.arch) {
        load_variant(family, |_| {}).unwrap();
    }
}

#[test]
fn lfm2_conv_layers_that_disagree_on_kernel_length_are_refused() {
    assert_refused(
        "lfm2",
        &["blk.3.shortconv.conv.weight", "kernel length 4"],
        |w| {
            // layer 3's kernel becomes length 4 (64 channels) while the model says 3
            w.set_tensor(
                "blk.3.shortconv.conv.weight",
                &[4, 64],
                GgmlType::F32,
                vec![0; 4 * 64 * 4],
            );
        },
    );

    assert_refused(
        "lfm2",
        &["blk.0.shortconv.conv.weight", "kernel length 3"],
        |w| {
            w.set_kv("lfm2.shortconv.l_cache", Value::U32(4));
        },
    );
}

#[test]
fn lfm2_layer_kinds_come_from_the_container() {
    // Turning layer 0's KV head count from 0 to 2 makes it an attention layer,
    // whose tensors this file does not have: refused by tensor name.
    assert_refused("lfm2", &["blk.0.attn_q.weight"], |w| {
        let kv = [2u32, 0, 2, 0, 0, 2, 0, 2].map(Value::U32).to_vec();
        w.set_kv("lfm2.attention.head_count_kv", Value::Array(kv));
    });
}

#[test]
fn a_declared_qk_norm_without_its_tensor_is_refused() {
    assert_refused("qwen3", &["blk.2.attn_q_norm.weight", "absent"], |w| {
        w.remove_tensor("blk.2.attn_q_norm.weight");
    });
}

#[test]
fn unimplemented_declarations_are_refused_by_name() {
    // IMROPE sections as llama.cpp's loader and ggml's rope refuse them:
    // not four entries, t/h/w all 0, a sum past the head dim (32 here);
    // a pair on the fourth component runs (it turns by 0 for text).
    let secs = |v: [u32; 4]| Value::Array(v.map(Value::U32).to_vec());
    for (family, bad, what) in [
        (
            "qwen35",
            Value::Array(vec![Value::U32(2); 3]),
            "expected 4 entries",
        ),
        ("qwen35", secs([0, 0, 0, 4]), "all 0"),
        ("qwen3vl", secs([16, 8, 8, 1]), "more than the head dim 32"),
    ] {
        let key = format!("{family}.rope.dimension_sections");
        assert_refused(family, &[&key, what], |w| {
            w.set_kv(&key, bad.clone());
        });
    }
    load_variant("qwen35", |w| {
        w.set_kv("qwen35.rope.dimension_sections", secs([2, 1, 0, 1]));
    })
    .unwrap();
    // qwen3vl's loader requires the sections, and the graph a rotary
    // width equal to the head dim.
    assert_refused(
        "qwen3vl",
        &["qwen3vl.rope.dimension_sections", "required"],
        |w| {
            w.remove_kv("qwen3vl.rope.dimension_sections");
        },
    );
    assert_refused(
        "qwen3vlmoe",
        &["qwen3vlmoe.rope.dimension_count", "must be the head dim"],
        |w| {
            w.set_kv("qwen3vlmoe.rope.dimension_count", Value::U32(16));
        },
    );

    assert_refused("llama", &["llama.rope.scaling.type", "yarn"], |w| {
        w.set_kv("llama.rope.scaling.type", Value::Str("yarn".into()));
        w.set_kv("llama.rope.scaling.factor", Value::F32(4.0));
    });

    assert_refused("llama", &["mamba", "not a family"], |w| {
        w.set_kv("general.architecture", Value::Str("mamba".into()));
    });
}

#[test]
fn hunyuan_alpha_key_applies_on_top_of_the_folded_base() {
    // alpha 2 multiplies the folded base by 2^(16/14) (rotary width 16), and
    // the semantics line names the key.
    let g = Gguf::open(Fixture::new("hunyuan-dense").dir.join("f32.gguf")).unwrap();
    let mut w = GgufWriter::from_gguf(&g);
    w.set_kv("hunyuan-dense.rope.scaling.alpha", Value::F32(2.0));
    let dir = TempDir::new("hy");
    let p = dir.file("v.gguf", &w.to_bytes());
    let o = load::open(&p).unwrap();
    let base = 26826958.0f64 * 2f64.powf(16.0 / 14.0);
    let got = o.sem.rope_full.value.base;
    assert!((got - base).abs() / base < 1e-6, "{got} vs {base}");
    assert!(o
        .sem
        .rope_full
        .source
        .contains("hunyuan-dense.rope.scaling.alpha"));
}

#[test]
fn a_q8_0_kv_cache_on_heads_of_16_is_refused_by_name() {
    // qwen2's fixture has 16-wide heads; q8_0 blocks hold 32 values.
    let path = Fixture::new("qwen2").dir.join("f32.gguf");
    let exec = ExecConfig {
        kv_type: onebit_kernels::kv::KvType::Q8_0,
        ..ExecConfig::default()
    };
    let e = load::load(&path, &exec)
        .map(|_| ())
        .unwrap_err()
        .to_string();
    assert!(
        e.contains(&path.display().to_string()) && e.contains("q8_0") && e.contains("is 16"),
        "{e}"
    );
    let f16 = ExecConfig {
        kv_type: onebit_kernels::kv::KvType::F16,
        ..ExecConfig::default()
    };
    load::load(&path, &f16).unwrap();
}

#[test]
fn nanbeige_loop_counts_out_of_range_are_refused_by_name() {
    assert_refused("nanbeige", &["nanbeige.num_loops", "at least 1"], |w| {
        w.set_kv("nanbeige.num_loops", Value::U32(0));
    });
    // 3 layers x 2000 passes = 6000 state slots, over the 4096-layer bound.
    assert_refused("nanbeige", &["nanbeige.num_loops", "4096"], |w| {
        w.set_kv("nanbeige.num_loops", Value::U32(2000));
    });
}

#[test]
fn gemma4_experts_and_a_shared_kv_source_of_another_kind_are_refused_by_name() {
    // Experts declared without the rest of their declarations.
    assert_refused("gemma4", &["gemma4.expert_used_count", "absent"], |w| {
        w.set_kv("gemma4.expert_count", Value::U32(8));
    });
    // 3 shared layers of SSFSFSF: layer 4 (full) would read layer 3 (sliding).
    assert_refused(
        "gemma4",
        &["gemma4.attention.shared_kv_layers", "another kind"],
        |w| {
            w.set_kv("gemma4.attention.shared_kv_layers", Value::U32(3));
        },
    );
}

/// A gemma4 rule llama.cpp's loader (`src/models/gemma4.cpp`) reads and
/// onebit does not run yet is refused by name, not run approximately:
/// per-layer FFN widths (`feed_forward_length` as an array: the real E2B
/// doubles the MLP of its KV-shared layers).
#[test]
fn gemma4_per_layer_ffn_widths_are_refused_by_name() {
    let widths: Vec<Value> = (0..7)
        .map(|i| Value::I32(if i >= 5 { 256 } else { 128 }))
        .collect();
    assert_refused(
        "gemma4",
        &[
            "gemma4.feed_forward_length",
            "expected a non-negative integer",
        ],
        |w| {
            w.set_kv("gemma4.feed_forward_length", Value::Array(widths.clone()));
        },
    );
}

/// Per-layer KV head counts (`gemma4.attention.head_count_kv` as an array,
/// llama.cpp's `n_head_kv(il)`) run one count per layer kind: an array of
/// the wrong length, two counts within one kind, or a count that does not
/// divide the query heads is refused by the key's name.
#[test]
fn gemma4_per_layer_kv_head_counts_it_cannot_run_are_refused_by_name() {
    // gemma4-a4b: SSFSFSF, [2, 2, 1, 2, 1, 2, 1].
    let arr = |v: &[u32]| Value::Array(v.iter().map(|&x| Value::U32(x)).collect());
    for (heads, what) in [
        (&[2u32, 2, 1, 2, 1, 2][..], "has 6 entries for 7 layers"),
        (
            &[2, 1, 1, 2, 1, 2, 1][..],
            "layer 1 declares 1 KV heads and layer 0",
        ),
        (
            &[2, 2, 3, 2, 3, 2, 3][..],
            "layer 2: 3 does not divide the head count 4",
        ),
        (
            &[2, 2, 1, 2, 2, 2, 1][..],
            "layer 4 declares 2 KV heads and layer 2",
        ),
    ] {
        let e = load_variant("gemma4-a4b", |w| {
            w.set_kv("gemma4.attention.head_count_kv", arr(heads));
        })
        .unwrap_err();
        assert!(
            e.contains("gemma4.attention.head_count_kv") && e.contains(what),
            "{heads:?}: {e}"
        );
    }
    // Counts swapped between the kinds: the tensors' shapes disagree, by name.
    assert_refused(
        "gemma4-a4b",
        &["blk.0.attn_k.weight", "expected [64, 16]"],
        |w| {
            w.set_kv(
                "gemma4.attention.head_count_kv",
                arr(&[1, 1, 2, 1, 2, 1, 2]),
            );
        },
    );
}

/// A layer without `attn_v` takes V from its K projection (llama.cpp's
/// `Vcur = wv ? wv*cur : Kcur`): declared per layer from the tensors, and a
/// V bias on such a layer is refused by the tensor's name.
#[test]
fn gemma4_v_from_k_is_declared_by_the_missing_attn_v_and_a_v_bias_is_refused() {
    let open = |edit: &dyn Fn(&mut GgufWriter)| {
        let g = Gguf::open(Fixture::new("gemma4").dir.join("f32.gguf")).unwrap();
        let mut w = GgufWriter::from_gguf(&g);
        edit(&mut w);
        let dir = TempDir::new("v-from-k");
        let p = dir.file("v.gguf", &w.to_bytes());
        load::open(&p).map(|o| o.sem).map_err(|e| e.to_string())
    };
    let s = open(&|_| {}).unwrap();
    assert!(!s.v_from_k.value.contains(&true));
    let s = open(&|w| {
        w.remove_tensor("blk.0.attn_v.weight");
    })
    .unwrap();
    assert_eq!(
        s.v_from_k.value,
        [true, false, false, false, false, false, false]
    );
    let line = s.to_string();
    assert!(
        line.contains("values from keys: layers [0]") && line.contains("Vcur = wv"),
        "{line}"
    );
    load_variant("gemma4", |w| {
        w.remove_tensor("blk.0.attn_v.weight");
    })
    .unwrap();

    assert_refused(
        "gemma4-a4b",
        &["blk.2.attn_v.bias", "declared to be its K projection"],
        |w| {
            w.set_tensor("blk.2.attn_v.bias", &[32], GgmlType::F32, vec![0; 32 * 4]);
        },
    );
}

/// Routed-experts declarations onebit does not run are refused by the
/// key's or tensor's name: DeepSeek's group-limited routing, a gating the
/// family's graph does not run, more chosen experts than there are, dense
/// layers qwen3moe does not have, a stacked expert tensor of the wrong
/// shape.
#[test]
fn qwen3moe_routing_it_does_not_run_is_refused_by_name() {
    let cases: [(&str, Value, &str); 4] = [
        (
            "qwen3moe.expert_group_count",
            Value::U32(4),
            "group-limited",
        ),
        ("qwen3moe.expert_gating_func", Value::U32(2), "runs Softmax"),
        (
            "qwen3moe.expert_used_count",
            Value::U32(9),
            "at most the expert count",
        ),
        (
            "qwen3moe.leading_dense_block_count",
            Value::U32(1),
            "does not have",
        ),
    ];
    for (key, v, what) in cases {
        assert_refused("qwen3moe", &[key, what], |w| {
            w.set_kv(key, v.clone());
        });
    }
    assert_refused(
        "qwen3moe",
        &["blk.1.ffn_up_exps.weight", "[64, 32, 8]"],
        |w| {
            // 7 experts where the model declares 8.
            w.set_tensor(
                "blk.1.ffn_up_exps.weight",
                &[64, 32, 7],
                GgmlType::F32,
                vec![0; 64 * 32 * 7 * 4],
            );
        },
    );
}

/// lfm2moe reads its gating from `expert_gating_func`: a gating onebit
/// does not run (3, llama.cpp's softmax over the chosen weights) is
/// refused by the key's name; a leading dense layer count that leaves no
/// routed layer, by the key's name too.
#[test]
fn lfm2moe_gating_and_dense_layers_it_does_not_run_are_refused_by_name() {
    let cases: [(&str, Value, &str); 2] = [
        (
            "lfm2moe.expert_gating_func",
            Value::U32(3),
            "not one onebit runs",
        ),
        (
            "lfm2moe.leading_dense_block_count",
            Value::U32(6),
            "no layer routes",
        ),
    ];
    for (key, v, what) in cases {
        assert_refused("lfm2moe", &[key, what], |w| {
            w.set_kv(key, v.clone());
        });
    }
}

/// Gemma 4's expert layers run llama.cpp's graph (`src/models/gemma4.cpp`),
/// which hard-codes renormalization and a weight scale of 1 and reads no
/// per-expert scale of the gate and up products: a container stating
/// otherwise is refused by the key's or tensor's name; so is a layer
/// without its MoE branch norm.
#[test]
fn gemma4_expert_rules_it_does_not_run_are_refused_by_name() {
    let cases: [(&str, Value, &str); 3] = [
        (
            "gemma4.expert_weights_norm",
            Value::Bool(false),
            "always renormalizes",
        ),
        (
            "gemma4.expert_weights_scale",
            Value::F32(2.5),
            "per-expert scale",
        ),
        ("gemma4.expert_gating_func", Value::U32(2), "runs Softmax"),
    ];
    for (key, v, what) in cases {
        assert_refused("gemma4-moe", &[key, what], |w| {
            w.set_kv(key, v.clone());
        });
    }
    assert_refused(
        "gemma4-moe",
        &["blk.2.ffn_up_exps.scale", "not implemented"],
        |w| {
            w.set_tensor(
                "blk.2.ffn_up_exps.scale",
                &[8],
                GgmlType::F32,
                vec![0; 8 * 4],
            );
        },
    );
    assert_refused(
        "gemma4-moe",
        &["blk.3.pre_ffw_norm_2.weight", "absent"],
        |w| {
            w.remove_tensor("blk.3.pre_ffw_norm_2.weight");
        },
    );
    // A per-expert output scale on a later layer only: refused, not ignored.
    assert_refused(
        "gemma4-moe",
        &["blk.1.ffn_down_exps.scale", "no expert output scale"],
        |w| {
            w.remove_tensor("blk.0.ffn_down_exps.scale");
        },
    );
}

/// gpt-oss's graph requires its sinks, its output, router and expert
/// biases (llama.cpp creates them with flag 0): a file without one is
/// refused by the tensor's name, not run without it. Its gating is the
/// graph's (SOFTMAX_WEIGHT): a file stating another is refused by the key.
#[test]
fn gpt_oss_tensors_and_rules_it_requires_are_refused_by_name() {
    for t in [
        "blk.0.attn_sinks.weight",
        "blk.1.attn_output.bias",
        "blk.2.ffn_gate_inp.bias",
        "blk.3.ffn_gate_exps.bias",
        "blk.0.ffn_up_exps.bias",
        "blk.1.ffn_down_exps.bias",
    ] {
        assert_refused("gpt-oss", &[t], |w| {
            w.remove_tensor(t);
        });
    }
    assert_refused(
        "gpt-oss",
        &["gpt-oss.expert_gating_func", "SoftmaxWeight"],
        |w| {
            w.set_kv("gpt-oss.expert_gating_func", Value::U32(1));
        },
    );
    // A sink per KV head (2) where the model has 4 query heads.
    assert_refused("gpt-oss", &["blk.2.attn_sinks.weight", "[4]"], |w| {
        w.set_tensor("blk.2.attn_sinks.weight", &[2], GgmlType::F32, vec![0; 8]);
    });
}
