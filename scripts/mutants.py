#!/usr/bin/env python3
"""Revert one model rule at a time and check that the test suite notices.

Each mutant is (name, file, exact text, replacement, test filter). The script
applies it, runs `cargo test` on the given target, expects a failure, and
restores the file. It prints one line per mutant: CAUGHT or SURVIVED.

    scripts/mutants.py            # all mutants
    scripts/mutants.py gemma3     # those whose name contains "gemma3"
"""
import subprocess, sys, pathlib

ROOT = pathlib.Path(__file__).resolve().parent.parent
G3 = "crates/onebit-model/src/families/gemma3.rs"
G4 = "crates/onebit-model/src/families/gemma4.rs"
COMMON = "crates/onebit-model/src/families/common.rs"
MIXERS = "crates/onebit-model/src/mixers/mod.rs"
SHORT_CONV = "crates/onebit-model/src/mixers/short_conv.rs"
DELTA_NET = "crates/onebit-model/src/mixers/delta_net.rs"
ATTENTION = "crates/onebit-model/src/mixers/attention.rs"
FORWARD = "crates/onebit-model/src/forward.rs"
MODEL_TESTS = ["-p", "onebit-model"]
PACK_TESTS = ["-p", "onebit-model", "--test", "pack", "--lib"]
NAMES = "crates/onebit-model/src/pack/names.rs"
MOE = "crates/onebit-model/src/moe.rs"
GEMMA4_MOE_TESTS = ["-p", "onebit-model", "--test", "golden", "gemma4"]
SOFT_CAP_TESTS = ["-p", "onebit-model", "--test", "golden", "soft_cap"]

MUTANTS = [
    ("qwen3moe: chosen experts' weights not renormalized", "crates/onebit-model/src/families/qwen3moe.rs",
     "norm_default: true,", "norm_default: false,", MODEL_TESTS),
    ("lfm2moe: leading dense layers treated as routed", "crates/onebit-model/src/semantics.rs",
     "        il >= self.leading_dense.value", "        il < usize::MAX", MODEL_TESTS),
    ("lfm2moe: exp_probs_b ignored when choosing", MOE,
     "        Some(b) => scores[e] + b[e],", "        Some(_) => scores[e],", MODEL_TESTS),
    ("qwen35moe: the shared expert's gate off", "crates/onebit-model/src/families/qwen35moe.rs",
     "    shared_gate: true,", "    shared_gate: false,", MODEL_TESTS),
    ("moe: the routed scale not applied", MOE,
     "chosen.iter_mut().for_each(|(_, w)| *w *= s);", "", MODEL_TESTS),
    ("moe: the selection bias also weighs the chosen experts", MOE,
     "chosen.push((e, scores[e]));", "chosen.push((e, select(e)));", MODEL_TESTS),
    ("gemma3: every 6th layer full -> i % 6 == 0", G3,
     "if (i + 1) % p == 0 {", "if i % p == 0 {", MODEL_TESTS),
    ("gemma3: sliding base 10000 when absent -> the model's base", G3,
     "sliding.base = DEFAULT_SWA_BASE;", "", MODEL_TESTS),
    ("gemma3: sandwich norms off", G3,
     'post_mixer_norm: Some("post_attention_norm.weight"),', 'post_mixer_norm: None,', MODEL_TESTS),
    ("gemma3: +1 added again to stored norms", G3,
     "        NormForm::Plain,\n        \"gemma3 GGUF", "        NormForm::OnePlus,\n        \"gemma3 GGUF", MODEL_TESTS),
    ("gemma3: no embedding scale", G3,
     "Some((s.dims.n_embd as f32).sqrt())", "None", MODEL_TESTS),
    ("gemma3: attention scale from n_embd/n_head instead of key_length", COMMON,
     "1.0 / (head_dim_k as f32).sqrt()", "1.0 / ((n_embd / n_head) as f32).sqrt()", MODEL_TESTS),
    ("gemma3: linear scaling on sliding layers too", G3,
     "sliding.scaling = RopeScaling::None;", "", MODEL_TESTS),
    ("gemma3: q/k norm off", G3,
     "        true,\n        QkNorm::BeforeRope,\n        \"gemma3", "        false,\n        QkNorm::BeforeRope,\n        \"gemma3", MODEL_TESTS),
    ("llama: halves instead of interleaved RoPE", "crates/onebit-model/src/families/llama.rs",
     "RopeStyle::Interleaved,", "RopeStyle::Halves,", MODEL_TESTS),
    ("sliding window off by one", ATTENTION,
     "(p + 1).saturating_sub(w)", "p.saturating_sub(w)", MODEL_TESTS),
    ("qwen3: q/k norm off", "crates/onebit-model/src/families/qwen3.rs",
     "        true,\n        QkNorm::BeforeRope,", "        false,\n        QkNorm::BeforeRope,", MODEL_TESTS),
    ("hunyuan: q/k norm before RoPE instead of after", "crates/onebit-model/src/families/hunyuan.rs",
     "QkNorm::AfterRope,", "QkNorm::BeforeRope,", MODEL_TESTS),
    ("qwen2: q bias not added", ATTENTION,
     "add_bias(q, aw.bq.as_deref());", "", MODEL_TESTS),
    ("phi3: LongRoPE attention factor dropped", "crates/onebit-model/src/families/phi3.rs",
     "rope.attn_factor = f;", "", MODEL_TESTS),
    ("lfm2: conv window misaligned (current input on tap 0)", MIXERS,
     "acc += taps[l - 1] * input[ch];", "acc += taps[0] * input[ch];", MODEL_TESTS),
    ("lfm2: conv state not carried across decode steps", SHORT_CONV,
     "            for t in s.rows.clone() {", "            history.fill(0.0);\n            for t in s.rows.clone() {", MODEL_TESTS),
    ("lfm2: C gate dropped", SHORT_CONV,
     "yt.iter_mut().zip(c).for_each(|(v, c)| *v *= c);", "", MODEL_TESTS),
    ("lfm2: layer kinds ignore the container (all attention)", "crates/onebit-model/src/families/lfm2.rs",
     "                if h == 0 {\n                    LayerKind::ShortConv", "                if h == 999 {\n                    LayerKind::ShortConv", MODEL_TESTS),
    ("qwen35: no state decay", DELTA_NET,
     "st.iter_mut().for_each(|x| *x *= decay);", "", MODEL_TESTS),
    ("qwen35: grouped instead of tiled v-to-k head map", DELTA_NET,
     "let hk = hv % nk;", "let hk = hv / (nv / nk);", MODEL_TESTS),
    ("qwen35: recurrent state not carried across decode steps", DELTA_NET,
     "            for t in sq.rows.clone() {", "            state.fill(0.0);\n            for t in sq.rows.clone() {", MODEL_TESTS),
    ("nanbeige: the layers run once (num_loops ignored)", "crates/onebit-model/src/families/nanbeige.rs",
     "Some(l) => (l, d.src(NUM_LOOPS)),", "Some(_) => (1, d.src(NUM_LOOPS)),", MODEL_TESTS),
    ("nanbeige: no output_norm between passes", "crates/onebit-model/src/families/nanbeige.rs",
     "loop_norm: !skip,", "loop_norm: false,", MODEL_TESTS),
    ("nanbeige: passes share one state slot", FORWARD,
     "let at = At { layer: il, slot };", "let at = At { layer: il, slot: il };", MODEL_TESTS),
    ("longrope: the long table never selected", "crates/onebit-model/src/semantics.rs",
     "                    rope.value.freq_factors = Some(long.clone());\n", "", MODEL_TESTS),
    ("gemma4 pack: proportional divisors off by one pair", "crates/onebit-model/src/semantics.rs",
     "if i < rotated { 1.0 } else { 1e30 }", "if i <= rotated { 1.0 } else { 1e30 }", PACK_TESTS),
    ("gemma4 pack: config.json partial_rotary_factor halved", G4,
     '"partial_rotary_factor": (2 * pairs) as f64 / r.n_rot as f64,', '"partial_rotary_factor": pairs as f64 / r.n_rot as f64,', PACK_TESTS),
    ("gemma4 pack: embedding not pre-scaled", G4,
     "prescale_embedding: true,", "prescale_embedding: false,", PACK_TESTS),
    ("gemma4 pack: head_dim taken as the full layers' head", G4,
     "        s.dims.head_dim_k = full;\n        s.dims.head_dim_v = full;\n", "", PACK_TESTS),
    ("gemma4 pack: per-layer projection width taken as the hidden size", NAMES,
     '    ("blk.{i}.proj.weight", &["blk.{i}.inp_gate.weight"]),\n', "", PACK_TESTS),
    ("gemma4: shared-KV sliding layers read another sliding layer", G4,
     "let from = first - if kinds[i] == LayerKind::Sliding { 2 } else { 1 };", "let from = first - if kinds[i] == LayerKind::Sliding { 4 } else { 1 };", MODEL_TESTS),
    ("gemma4: proportional RoPE factors dropped on full layers", G4,
     "    s.attn_scale = Sourced::new(1.0,", "    s.rope_full.value.freq_factors = None;\n    s.attn_scale = Sourced::new(1.0,", MODEL_TESTS),
    ("gemma4: attention scale 1/sqrt(head dim) instead of 1", G4,
     "    s.attn_scale = Sourced::new(1.0,", "    let _ = Sourced::new(1.0,", MODEL_TESTS),
    ("gemma4: shared-KV layers allocate a KV cache of their own", "crates/onebit-model/src/state.rs",
     "let (kw, vw) = if own { sem.kv_widths(kind) } else { (0, 0) };", "let (kw, vw) = sem.kv_widths(kind);", ["-p", "onebit-model", "--test", "sequence_state"]),
    ("gemma4: v norm off", G4,
     "s.v_norm = Sourced::new(true,", "s.v_norm = Sourced::new(false,", MODEL_TESTS),
    ("gemma4: final soft-cap dropped", G4,
     "Sourced::new(Some(cap as f32), d.src(k::FINAL_SOFTCAP))", "Sourced::new(None, d.src(k::FINAL_SOFTCAP))", MODEL_TESTS),
    ("gemma4: no soft-cap when a GGUF does not state one (llama.cpp runs 30)", G4,
     "            Some(GGUF_DEFAULT_SOFTCAP),\n", "            None,\n", SOFT_CAP_TESTS),
    ("gemma3: a stated soft-cap of 0 run as a cap of 0 (llama.cpp: none)", G3,
     ".filter(|&c| c != 0.0)", ".filter(|_| true)", SOFT_CAP_TESTS),
    # Not a mutant: dropping the per-layer input's 1/sqrt(2) (or the projection's
    # 1/sqrt(n_embd)) scales the whole per-layer branch before its post_norm
    # RMSNorm, which cancels it up to eps; only the token rows' sqrt(width),
    # which weighs the two halves of the input against each other, is seen.
    ("gemma4: per-layer token rows not scaled by sqrt(width)", FORWARD,
     "let tok_scale = (pl as f32).sqrt();", "let tok_scale = 1.0;", MODEL_TESTS),
    ("gemma4: layer output scale dropped", G4,
     "output_scale: output_scale.then_some(OUTPUT_SCALE),", "output_scale: None,", MODEL_TESTS),
    ("gemma4: sliding pattern ignored (every layer full)", COMMON,
     "Some(true) => Ok(LayerKind::Sliding),", "Some(true) => Ok(LayerKind::Full),", MODEL_TESTS),
    # Gemma 4's expert layers (the gemma4-moe fixture); run: scripts/mutants.py gemma4-moe
    ("gemma4-moe: per-expert output scale off", MOE,
     "let s = sc[x];", "let s = 1.0 + 0.0 * sc[x];", GEMMA4_MOE_TESTS),
    ("gemma4-moe: chosen experts' weights not renormalized", MOE,
     "    if m.norm_weights.value {", "    if false && m.norm_weights.value {", GEMMA4_MOE_TESTS),
    ("gemma4-moe: the dense MLP beside the experts dropped", MOE,
     "            let s = &*s;\n", "            let s = &vec![0f32; s.len()][..];\n", GEMMA4_MOE_TESTS),
    ("gemma4-moe: the experts' sum not normed (post_ffw_norm_2 dropped)", MOE,
     "            rmsnorm_inplace(o, &b.experts_out, eps);", "            let _ = b;", GEMMA4_MOE_TESTS),
    ("gemma4-moe: the dense MLP's output not normed (post_ffw_norm_1 dropped)", MOE,
     "                rmsnorm_inplace(s, &b.shared_out, eps);", "                let _ = b;", GEMMA4_MOE_TESTS),
    ("gemma4-moe: the experts read the FFN input (pre_ffw_norm_2 dropped)", MOE,
     "            normed = r;\n            &normed", "            normed = r;\n            let _ = &normed;\n            h", GEMMA4_MOE_TESTS),
    ("gemma4-moe: the router reads the FFN input", MOE,
     "            scaled = r;\n            &scaled", "            scaled = r;\n            let _ = &scaled;\n            h", GEMMA4_MOE_TESTS),
    ("gemma4-moe: the router's 1/sqrt(n_embd) dropped", MOE,
     "let c = 1.0 / (e as f32).sqrt();", "let c = 1.0;", GEMMA4_MOE_TESTS),
    # Gemma-4-26B-A4B's attention rules (the gemma4-a4b fixture; config.json in the lib's pack
    # tests); run: scripts/mutants.py gemma4-a4b
    ("gemma4-a4b: V from the k-normed K instead of the raw K projection", ATTENTION,
     "                sized(v, n * vw).copy_from_slice(&k[..n * kw]);\n",
     "                sized(v, n * vw).copy_from_slice(&k[..n * kw]);\n"
     "                if let Some(w) = kv.k_norm.as_ref() { v.chunks_exact_mut(dk).for_each(|h| rmsnorm_inplace(h, w, eps)); }\n",
     GEMMA4_MOE_TESTS),
    ("gemma4-a4b: V from K without the v norm", ATTENTION,
     "            if sem.v_norm.value {", "            if sem.v_norm.value && kv.wv.is_some() {", GEMMA4_MOE_TESTS),
    ("gemma4-a4b: per-kind KV head counts swapped", "crates/onebit-model/src/semantics.rs",
     "            (Some(h), LayerKind::Sliding) => h.value,\n            _ => self.dims.n_head_kv,",
     "            (Some(_), LayerKind::Sliding) => self.dims.n_head_kv,\n            (Some(h), _) => h.value,\n            _ => self.dims.n_head_kv,",
     GEMMA4_MOE_TESTS),
    ("gemma4-a4b: head_count_kv entries read into the other kind", COMMON,
     "by_kind[usize::from(kind == LayerKind::Sliding)]", "by_kind[usize::from(kind != LayerKind::Sliding)]",
     GEMMA4_MOE_TESTS),
    ("gemma4-a4b: the attention's GQA map takes the full layers' KV heads on every layer", ATTENTION,
     "n_head_kv: sem.kv_heads(kind),", "n_head_kv: d.n_head_kv,", GEMMA4_MOE_TESTS),
    ("gemma4-a4b: KV caches sized with the full layers' KV heads", "crates/onebit-model/src/state.rs",
     "let (kw, vw) = if own { sem.kv_widths(kind) } else { (0, 0) };",
     "let (kw, vw) = if own { let (a, b) = sem.head_dims(kind); (sem.dims.n_head_kv * a, sem.dims.n_head_kv * b) } else { (0, 0) };",
     # The attention reads the cache contiguously, so the logits do not change; the rows
     # (truncation, snapshots, bytes) do: sequence_state checks each kind's widths.
     ["-p", "onebit-model", "--test", "sequence_state"]),
    ("gemma4-a4b pack: attention_k_eq_v takes V from K on sliding layers too", G4,
     ".map(|(&k, &o)| o && k == LayerKind::Full)", ".map(|(_, &o)| o)", PACK_TESTS),
    ("gemma4-a4b pack: num_global_key_value_heads not applied", G4,
     "            s.dims.n_head_kv = g;\n", "", PACK_TESTS),
    ("gemma4-a4b pack: a different num_global_key_value_heads accepted without attention_k_eq_v", G4,
     "if let Some(g) = global.filter(|&g| g != sliding) {", "if let Some(g) = global.filter(|_| false) {", PACK_TESTS),
    ("qwen35: attention output gate dropped", ATTENTION,
     "ctx.iter_mut().zip(&g).for_each(|(c, g)| *c *= sigmoid(*g));", "let _ = g;", MODEL_TESTS),
]


# gpt-oss (the gpt-oss fixture; the semantics test for the YaRN arithmetic); run: scripts/mutants.py gpt-oss
GPT_OSS_TESTS = ["-p", "onebit-model", "--test", "golden", "f32_weights"]
OPS = "crates/onebit-kernels/src/ops.rs"
MUTANTS += [
    ("gpt-oss: attention sinks off", ATTENTION, "cap, aw.sinks.as_deref());", "cap, None);", GPT_OSS_TESTS),
    ("gpt-oss: swiglu_oai clamp off", OPS,
     "pub const SWIGLU_OAI_LIMIT: f32 = 7.0;", "pub const SWIGLU_OAI_LIMIT: f32 = 1e30;", GPT_OSS_TESTS),
    ("gpt-oss: swiglu_oai +1 on up off (AVX2 lanes)", OPS,
     "_mm256_mul_ps(glu, _mm256_add_ps(y, _mm256_set1_ps(1.0)))", "_mm256_mul_ps(glu, y)", GPT_OSS_TESTS),
    ("gpt-oss: softmax over all experts before the top k", "crates/onebit-model/src/families/gpt_oss.rs",
     "gating: Some(Gating::SoftmaxWeight),", "gating: Some(Gating::Softmax),", GPT_OSS_TESTS),
    ("gpt-oss: YaRN off", "crates/onebit-model/src/families/gpt_oss.rs",
     "        rope.scaling = RopeScaling::Yarn {", "        let _unused = RopeScaling::Yarn {", GPT_OSS_TESTS),
    ("gpt-oss: YaRN magnitude factor off", "crates/onebit-model/src/semantics.rs",
     "self.attn_factor * (1.0 + 0.1 * factor.ln())", "self.attn_factor", GPT_OSS_TESTS),
    ("gpt-oss: YaRN ramp off (every pair interpolated)", "crates/onebit-model/src/semantics.rs",
     "(e / factor) * (1.0 - mix) + e * mix", "e / factor", GPT_OSS_TESTS),
    ("gpt-oss: sliding pattern shifted by one", "crates/onebit-model/src/families/gpt_oss.rs",
     "if n == 0 || il % n < n - 1 {", "if n == 0 || (il + 1) % n < n - 1 {", GPT_OSS_TESTS),
    ("gpt-oss: router bias off", MOE,
     "if let Some(b) = &w.router_bias {", "if let Some(b) = None::<&Vec<f32>> {", GPT_OSS_TESTS),
    ("gpt-oss: expert gate/up biases off", MOE,
     "            add_rows(g, &b[x][0]);\n            add_rows(u, &b[x][1]);\n", "", GPT_OSS_TESTS),
    ("gpt-oss: expert down bias off", MOE, "            add_rows(d, &b[x][2]);\n", "", GPT_OSS_TESTS),
    ("gpt-oss: attention output bias off", ATTENTION, "add_bias(out, aw.bo.as_deref());", "", GPT_OSS_TESTS),
    ("gpt-oss: FFN input norm attn_norm instead of post_attention_norm", "crates/onebit-model/src/families/gpt_oss.rs",
     'ffn_norm: "post_attention_norm.weight",', 'ffn_norm: "attn_norm.weight",', GPT_OSS_TESTS),
]

PACK_LIB = ["-p", "onebit-model", "--lib"]
PACK_IT = ["-p", "onebit-model", "--test", "pack"]
FMT_LIB = ["-p", "onebit-formats", "--lib"]
PCFG = "crates/onebit-model/src/pack/config.rs"
Q4NX = "crates/onebit-formats/src/q4nx/mod.rs"
IMPORT = "crates/onebit-model/src/pack/import.rs"
FAM = "crates/onebit-model/src/families/"

# Pack rules (config.json, tiles, import); run: scripts/mutants.py pack:
MUTANTS += [
    ("pack: layer_types ignored, the pattern decides", FAM + "gemma3.rs",
     "if let Some(types) = d.get(k::LAYER_TYPES) {", "if let Some(types) = None::<Json> {", PACK_LIB),
    ("pack: stated rope_local_base_freq ignored", FAM + "gemma3.rs",
     "            sliding.base = b;\n", "", PACK_LIB),
    ("pack: rope_local_base_freq 0 accepted", FAM + "gemma3.rs",
     "Some(b) if b > 0.0 => {\n            sliding.base = b;", "Some(b) if b >= 0.0 => {\n            sliding.base = b;", PACK_LIB),
    ("pack: linear scaling factor 0 accepted", FAM + "common.rs",
     "Some(f) if f > 0.0 && f.is_finite() =>", "Some(f) if f >= 0.0 && f.is_finite() =>", PACK_LIB),
    ("pack: llama3/yarn scaling accepted as none", FAM + "common.rs",
     "Some(t) if own_scaling.contains(&t) => Ok(RopeScaling::None),", "Some(_) => Ok(RopeScaling::None),", PACK_LIB),
    ("pack: hunyuan alpha not applied", FAM + "hunyuan.rs",
     "rope.base = ntk_alpha_base(rope.base, alpha, dim);", "let _ = (alpha, &rope);", PACK_LIB),
    ("pack: query_pre_attn_scalar ignored", FAM + "gemma3.rs",
     "if let Some(q) = d.f64_opt(QUERY_PRE_ATTN_SCALAR)? {", "if let Some(q) = None::<f64> {", PACK_LIB),
    ("pack: stated use_qk_norm true ignored", FAM + "common.rs",
     "Some(true) => Sourced::new(order, d.src(k::USE_QK_NORM)),", "Some(true) => Sourced::new(QkNorm::None, d.src(k::USE_QK_NORM)),", PACK_LIB),
    ("pack: use_qk_norm read only where the family normalises", FAM + "common.rs",
     "        qk_norm: qk_norm(\n            d,\n            false,", "        qk_norm: qk_norm(\n            &Decls::config(&serde_json::Value::Null, d.path(), d.arch, &|_| None),\n            false,", PACK_LIB),
    ("pack: null use_qk_norm read as a statement", FAM + "decls.rs",
     "                    .filter(|v| !v.is_null())\n", "", PACK_LIB),
    ("pack: text_config not overlaid (outer keys decide)", PCFG,
     'outer.get("text_config")', 'outer.get("no_text_config")', PACK_LIB),
    ("pack: q_norm check names no config key", "crates/onebit-model/src/weights.rs",
     "            if !l.has(&n(t)) {", "            if false && !l.has(&n(t)) {", PACK_LIB),
    ("pack: norm_eps spelling not read", FAM + "decls.rs",
     '["rms_norm_eps", "norm_eps"]', '["rms_norm_eps"]', PACK_LIB),
    ("pack: gemma3 pack embedding scaled again", FAM + "gemma3.rs",
     "        ContainerKind::Pack => Sourced::new(\n            None,", "        ContainerKind::Pack => Sourced::new(\n            Some(1.0),", PACK_LIB),
    ("pack: llama pack rotates interleaved pairs", FAM + "llama.rs",
     "            RopeStyle::Halves,\n            \"llama pack", "            RopeStyle::Interleaved,\n            \"llama pack", PACK_LIB),
    ("pack: tokenizer_config.json bos_token not read", PCFG,
     'stated(tc, "bos_token")', 'stated(&Json::Null, "bos_token")', PACK_LIB),
    ("pack: bos_token object form not read", PCFG,
     'Json::Object(o) => o.get("content")', 'Json::Object(o) => o.get("no_content")', PACK_LIB),
    ("pack: add_bos_token false taken as absent", PCFG,
     'stated(tc, "add_bos_token").and_then(|v| v.as_bool())', 'stated(tc, "add_bos_token").and_then(|v| v.as_bool()).filter(|&b| b)', PACK_LIB),
    ("pack: generation_config.json eos ids dropped", PCFG,
     '("generation_config.json", generation_config),', '("generation_config.json", None),', PACK_LIB),
    ("pack: only the first id of an eos list", PCFG,
     "Json::Array(a) => a\n            .iter()", "Json::Array(a) => a\n            .iter().take(1)", PACK_LIB),
    ("pack: tile symmetric on zero minimums alone", Q4NX,
     "    if negative {\n        TileKind::Symmetric", "    if true {\n        TileKind::Symmetric", FMT_LIB),
    ("pack: -0 minimum counted as non-zero", Q4NX,
     "if m & 0x7FFF != 0 {", "if m != 0 {", FMT_LIB),
    ("pack: mixed-kind tensor accepted", Q4NX,
     "if let (Some(s), Some(a)) = (sym, asym) {", "if let (Some(s), Some(a), true) = (sym, asym, false) {", FMT_LIB),
    ("pack: kernel repack decides the kind per tile", Q4NX,
     "let flip = if kind == Q4Kind::Symmetric { 8 } else { 0 };", "let flip = if tile_kind_of(f, tile) == TileKind::Symmetric { 8 } else { 0 };", FMT_LIB),
    ("pack: row reader decides the kind per tile", Q4NX,
     "*o = value(f, shape.tile(data, row, c), kind, r, c % f.cols());", "let t = shape.tile(data, row, c); *o = value(f, t, if tile_kind_of(f, t) == TileKind::Symmetric { Q4Kind::Symmetric } else { Q4Kind::Asymmetric }, r, c % f.cols());", FMT_LIB),
    ("pack: tile scales/minimums at r*groups + g, not g*rows + r", Q4NX,
     "2 * (g * self.rows() + r)", "2 * (r * self.groups() + g)", FMT_LIB),
    ("pack: quarter-tile code byte (r/2)*128 + c, not c*8 + r/2", Q4NX,
     "TileForm::Quarter => c * 8 + r / 2", "TileForm::Quarter => (r / 2) * 128 + c", FMT_LIB),
    ("pack: chunk codes in the full tile's half order, not column order", Q4NX,
     "TileForm::Chunk4608 => c * 16 + r / 2", "TileForm::Chunk4608 => (r / 16) * 2048 + c * 8 + (r % 16) / 2", FMT_LIB),
    ("pack: symmetric nibble read as offset binary, not two's complement", Q4NX,
     "Q4Kind::Symmetric => (((nib << 4) as i8) >> 4) as f32", "Q4Kind::Symmetric => nib as f32 - 8.0", FMT_LIB),
    ("pack: --tiles auto writes full tiles off the 256 grid", IMPORT,
     "Tiles::Auto if !hidden.is_multiple_of(q4nx::COLS)", "Tiles::Auto if hidden.is_multiple_of(q4nx::COLS)", PACK_IT),
    ("pack: verify counts every row finite", "crates/onebit-model/src/pack/verify.rs",
     "finite_rows += v.iter().all(|x| x.is_finite()) as usize;", "finite_rows += 1;", PACK_IT),
    ("pack: import leaves llama q rows permuted", IMPORT,
     'gname.ends_with("attn_q.weight") {', 'gname.ends_with("attn_q.weight-") {', PACK_IT),
    ("pack: import does not pre-scale the gemma3 embedding", IMPORT,
     "v.iter_mut().for_each(|x| *x *= s);", "let _ = s;", PACK_IT),
]


# gpt-oss packs (FastFlowLM's q4nx/models/gpt_oss.py layout, its HF config
# keys, the tile codecs); run: scripts/mutants.py "gpt-oss pack".
OSS_PACK = "crates/onebit-model/src/pack/gpt_oss.rs"
OSS_FAM = "crates/onebit-model/src/families/gpt_oss.rs"
OSS_TESTS = ["-p", "onebit-model", "--test", "pack_gpt_oss"]
MXFP4_TILE = "crates/onebit-formats/src/q4nx/mxfp4.rs"
MUTANTS += [
    ("gpt-oss pack: q/k/v/o tile rows grouped by 2, not 4", OSS_PACK,
     "Grouping { group: 4, pad: 16 }", "Grouping { group: 2, pad: 16 }", OSS_TESTS),
    ("gpt-oss pack: q/k/v/o tile rows padded to 4, not 16", OSS_PACK,
     "Grouping { group: 4, pad: 16 }", "Grouping { group: 4, pad: 4 }", OSS_TESTS),
    ("gpt-oss pack: lm_head tile rows not grouped by 2", OSS_PACK,
     "Grouping { group: 2, pad: 2 }", "Grouping { group: 1, pad: 2 }", OSS_TESTS),
    ("gpt-oss pack: experts neither padded to 4 tile rows nor grouped", OSS_PACK,
     "Grouping { group: 4, pad: 4 }", "Grouping { group: 1, pad: 1 }", OSS_TESTS),
    ("gpt-oss pack: up's row groups before gate's", OSS_PACK,
     "out.extend_from_slice(g);\n        out.extend_from_slice(u);", "out.extend_from_slice(u);\n        out.extend_from_slice(g);", OSS_TESTS),
    ("gpt-oss pack: expert biases at byte 192, not 128", OSS_PACK,
     "pub const BIAS_AT: usize = ROWS * COLS / 32;", "pub const BIAS_AT: usize = 192;", OSS_TESTS),
    ("gpt-oss pack: expert biases not kept in the tiles", OSS_PACK,
     "t[BIAS_AT + 2 * r..][..2].copy_from_slice(&bias[rb * ROWS + r].to_le_bytes());", "let _ = (&t, r, &bias);", OSS_TESTS),
    ("gpt-oss pack: router tiles row-major, not column-major", OSS_PACK,
     "(t * ROUTER_COLS + c) * ROUTER_TILE_ROWS + r", "(t * ROUTER_TILE_ROWS + r) * ROUTER_COLS + c", OSS_TESTS),
    ("gpt-oss pack: router copy not padded to 128 columns", OSS_PACK,
     "let hp = h.div_ceil(COLS) * COLS;\n            let mut prefill", "let hp = h;\n            let mut prefill", OSS_TESTS),
    ("gpt-oss pack: Q4_1 sources re-quantized, not repacked", OSS_PACK,
     "dt @ (GgmlType::Q4_0 | GgmlType::Q4_1) =>", "dt @ GgmlType::Q4_0 =>", OSS_TESTS),
    ("gpt-oss pack: config.json not checked to restate the GGUF", OSS_PACK,
     "restated(g, family, &sem, &config)?;", "let _ = restated;", OSS_TESTS),
    ("gpt-oss pack: float tensors' shapes not checked against config.json", OSS_PACK,
     "geo.plain_shape(&g) {", "geo.plain_shape(&g).filter(|_| false) {", OSS_TESTS),
    ("gpt-oss pack: verify reads the kept biases from the bias tensor", OSS_PACK,
     "&tile[BIAS_AT..BIAS_AT + 2 * ROWS],", "&le(&bias[e * n + rb * ROWS..][..ROWS]),", OSS_TESTS),
    ("gpt-oss pack: intermediate_size not read as the experts' width", OSS_FAM,
     "d.usize_opt(EXPERT_FF)? {", "d.usize_opt(EXPERT_FF)?.filter(|_| false) {", OSS_TESTS),
    ("gpt-oss pack: layer_types ignored", OSS_FAM,
     "match (d.get(k::LAYER_TYPES), d.get(key))", "match (d.get(k::LAYER_TYPES).filter(|_| false), d.get(key))", OSS_TESTS),
    ("gpt-oss pack: swiglu_limit not checked", OSS_FAM,
     "match d.f64_opt(SWIGLU_LIMIT)? {", "match d.f64_opt(SWIGLU_LIMIT)?.filter(|_| false) {", OSS_TESTS),
    ("gpt-oss pack: rope_scaling.attention_factor accepted", OSS_FAM,
     "d.f64_opt(YARN_ATTENTION_FACTOR)? {", "d.f64_opt(YARN_ATTENTION_FACTOR)?.filter(|_| false) {", OSS_TESTS),
    ("gpt-oss pack: rope_scaling.beta_fast not checked", OSS_FAM,
     'let fast = hard_coded(d, YARN_BETA_FAST_KEY, YARN_BETA_FAST, "beta_fast")?;', "let fast = String::new();", OSS_TESTS),
    ("gpt-oss pack: MXFP4 codes in column order, not the Q4 tile's half order", MXFP4_TILE,
     "MX_CODES_AT + (r / 16) * 1024 + c * 8 + (r % 16) / 2,", "MX_CODES_AT + c * 16 + r / 2,", FMT_LIB),
    ("gpt-oss pack: MXFP4 exponents at r*4 + g, not g*32 + r", MXFP4_TILE,
     "tile[g * MX_ROWS + r] = blk[0];", "tile[r * 4 + g] = blk[0];", FMT_LIB),
    ("gpt-oss pack: half-tile codes in column order", Q4NX,
     "TileForm::Half => (r / 16) * 1024 + c * 8 + (r % 16) / 2,", "TileForm::Half => c * 16 + r / 2,", FMT_LIB),
]

# EmbeddingGemma (gemma-embedding): its rules against llama.cpp's pooled
# embeddings (crates/onebit/tests/serve_embedding_gemma.rs).
GEMB = "crates/onebit-model/src/families/gemma_embedding.rs"
EMBED_TESTS = ["-p", "onebit", "--test", "serve_embedding_gemma"]
MUTANTS += [
    ("gemma-embedding: causal instead of bidirectional", GEMB,
     "        Mask::Bidirectional,", "        Mask::Causal,", EMBED_TESTS),
    ("gemma-embedding: no dense pooled head", GEMB,
     "s.pooled_head = Sourced::new(head, src);", "s.pooled_head = Sourced::new(Vec::new(), src); let _ = head;", EMBED_TESTS),
    ("gemma-embedding: last instead of mean pooling", "crates/onebit-serve/src/pooling.rs",
     "Some(1) => (PoolKind::Mean", "Some(1) => (PoolKind::Last", EMBED_TESTS),
    ("gemma-embedding: symmetric window not halved", ATTENTION,
     "(p.saturating_sub(w / 2), (p + w / 2 + 1).min(end))", "(p.saturating_sub(w), (p + w + 1).min(end))", EMBED_TESTS),
    ("gemma-embedding: no sliding window when bidirectional", ATTENTION,
     "Mask::Bidirectional => window.map_or((0, end), |w| {", "Mask::Bidirectional => None.map_or((0, end), |w: usize| {", EMBED_TESTS),
]


# Vision towers: the gemma3 tower and image rows in the text forward
# against llama.cpp's mtmd (crates/onebit-model/tests/vision.rs).
VG3 = "crates/onebit-model/src/vision/gemma3.rs"
VISION_TESTS = ["-p", "onebit-model", "--test", "vision"]
MUTANTS += [
    ("gemma3-vision: pooling takes each window's first patch", VG3,
     "*o = s / inv;", "*o = x[(oy * k * side + ox * k) * e + c] + 0.0 * s / inv;", VISION_TESTS),
    ("gemma3-vision: pooled grid read transposed", VG3,
     "s += x[((oy * k + ky) * side + ox * k + kx) * e + c];", "s += x[((ox * k + kx) * side + oy * k + ky) * e + c];", VISION_TESTS),
    ("gemma3-vision: soft-embedding norm off", VG3,
     "rmsnorm_inplace(row, &self.soft_norm, eps);", "let _ = row;", VISION_TESTS),
    ("gemma3-vision: image rows attend causally", ATTENTION,
     ".map_or(p + 1, |g| g.end),", ".map_or(p + 1, |_| p + 1),", VISION_TESTS),
    ("gemma3-vision: image rows scaled as token rows", FORWARD,
     "x[t * e..(t + 1) * e].copy_from_slice(&row[..e]);",
     "x[t * e..(t + 1) * e].iter_mut().zip(&row[..e]).for_each(|(a, b)| *a = b * self.sem.embed_scale.value.unwrap_or(1.0));",
     VISION_TESTS),
    ("gemma3-vision: no position embeddings", VG3,
     "*v = *v + b + q;", "*v = *v + b + 0.0 * q;", VISION_TESTS),
]


# qwen3vl: its tower and text side against llama.cpp's mtmd (tests/vision_qwen3vl.rs), the
# text side's IMROPE on text alone against llama.cpp (golden, fixtures qwen3vl and qwen3vlmoe).
VQ3 = "crates/onebit-model/src/vision/qwen3vl.rs"
QWEN3VL_TESTS = ["-p", "onebit-model", "--test", "vision_qwen3vl"]
QWEN3VL_GOLDEN = ["-p", "onebit-model", "--test", "golden"]
ROPE = "crates/onebit-kernels/src/rope.rs"
QVL = "crates/onebit-model/src/families/qwen3vl.rs"
MUTANTS += [
    ("qwen3vl: IMROPE sections off (every pair by t)", QVL,
     "        r.value.sections = Some(sections);", "        r.value.sections = None;", QWEN3VL_TESTS),
    ("qwen3vl: IMROPE one axis (image rows on t only)", FORWARD,
     "out.push([p, p + k / nx, p + k % nx, 0]);", "out.push([p, p, p, 0]);", QWEN3VL_TESTS),
    ("qwen3vl: IMROPE sections contiguous (MROPE) instead of interleaved", ROPE,
     "if s % 3 == 1 && s < 3 * sections[1] {\n                    1\n                } else if s % 3 == 2 && s < 3 * sections[2] {",
     "if s >= sections[0] && s < sections[0] + sections[1] {\n                    1\n                } else if s >= sections[0] + sections[1] && s < total - sections[3] {",
     QWEN3VL_TESTS),
    ("qwen3vl: text pairs on the fourth component turn by t", FORWARD,
     "out.push([p, p, p, 0]);", "out.push([p, p, p, p]);", QWEN3VL_GOLDEN),
    ("qwen3vl: image positions as text positions (consecutive, n_pos = rows)", FORWARD,
     ".filter_map(|e| e.grid.filter(|_| multi).map(|g| (e.at, g)))",
     ".filter_map(|e| e.grid.filter(|_| false).map(|g| (e.at, g)))", QWEN3VL_TESTS),
    ("qwen3vl: the text after an image at p + rows, not p + max(nx, ny)", FORWARD,
     "                    p += nx.max(ny);", "                    p += nx * ny;", QWEN3VL_TESTS),
    ("qwen3vl: grid rows and columns swapped", FORWARD,
     "out.push([p, p + k / nx, p + k % nx, 0]);", "out.push([p, p + k % nx, p + k / nx, 0]);", QWEN3VL_TESTS),
    ("qwen3vl: deepstack off", FORWARD,
     "let deep_here = (slot < body.deepstack).then_some(slot);", "let deep_here = None.filter(|_: &usize| slot < body.deepstack);",
     QWEN3VL_TESTS),
    ("qwen3vl: deepstack into the next layer", FORWARD,
     "let deep_here = (slot < body.deepstack).then_some(slot);",
     "let deep_here = (slot >= 1 && slot <= body.deepstack).then(|| slot - 1);",
     QWEN3VL_TESTS),
    ("qwen3vl: deepstack features in each other's layers", FORWARD,
     "let add = &f[k * e..(k + 1) * e];", "let k = body.deepstack - 1 - k;\n                    let add = &f[k * e..(k + 1) * e];",
     QWEN3VL_TESTS),
    ("qwen35: IMROPE sections not read (Qwen3.5 vision checkpoints)", "crates/onebit-model/src/families/qwen35.rs",
     "    super::qwen3vl::imrope(d, &mut s, family, false)?;\n", "", QWEN3VL_TESTS),
    ("qwen3vl: deepstack count not read", QVL,
     "Some(k) => (d.size_checked(N_DEEPSTACK, k)?, d.src(N_DEEPSTACK)),", "Some(_) => (0, d.src(N_DEEPSTACK)),",
     QWEN3VL_TESTS),
    ("qwen3vl-vision: 2-D rotary rows and columns swapped", VQ3,
     "(py, j)\n                } else {\n                    (px, j - quarter)", "(px, j)\n                } else {\n                    (py, j - quarter)", QWEN3VL_TESTS),
    ("qwen3vl-vision: patches column-major within a merge block", VQ3,
     "(2 * by + dy, 2 * bx + dx)", "(2 * by + dx, 2 * bx + dy)", QWEN3VL_TESTS),
    ("qwen3vl-vision: deepstack off", VQ3,
     "if let Some(m) = merger {", "if let Some(m) = merger.as_ref().filter(|_| false) {", QWEN3VL_TESTS),
    ("qwen3vl-vision: position grid not resized (12 patches wide on a grid of 8)", VQ3,
     "let xf = i0 as f32 / sx;", "let xf = i0 as f32;", QWEN3VL_TESTS),
    ("qwen3vl-vision: one temporal kernel only", VQ3,
     "map(|(a, b)| a + b)", "map(|(a, b)| a + 0.0 * b)", QWEN3VL_TESTS),
]


# Vision packs (FastFlowLM's vision_weights.q4nx: q4nx/models/gemma3.py,
# qwen3vl.py, model_converter.py vision_mm_weight_rearrange); run:
# scripts/mutants.py "vision pack".
VPACK = "crates/onebit-model/src/pack/vision.rs"
VPACK_TESTS = ["-p", "onebit-model", "--test", "pack_vision", "--lib"]
MUTANTS += [
    ("vision pack: blocks column-major inside", VPACK,
     "((n / MM_N * kb + k / mm_k) * MM_N + n % MM_N) * mm_k + k % mm_k",
     "((n / MM_N * kb + k / mm_k) * mm_k + k % mm_k) * MM_N + n % MM_N", VPACK_TESTS),
    ("vision pack: padded to MM_N, not max(MM_N, MM_K)", VPACK,
     "MM_N.max(mm_k)", "MM_N", VPACK_TESTS),
    ("vision pack: gemma3 blocks of 64 x 512", VPACK,
     "    mm_k: 256,\n    mm_k_read: &[256],", "    mm_k: 512,\n    mm_k_read: &[512],", VPACK_TESTS),
    ("vision pack: gemma3 input projection not transposed on import", VPACK,
     "let m = transpose(&b, k, n);\n                (", "let m = b.clone();\n                (", VPACK_TESTS),
    ("vision pack: gemma3 input projection not transposed back on reading", VPACK,
     "bf16_raw(vec![n as u64, k as u64], transpose(&w, n, k))", "bf16_raw(vec![n as u64, k as u64], w)", VPACK_TESTS),
    ("vision pack: qwen3vl patch frames stacked in the other order", VPACK,
     "        out.extend_from_slice(a);\n        out.extend_from_slice(b);",
     "        out.extend_from_slice(b);\n        out.extend_from_slice(a);", VPACK_TESTS),
    ("vision pack: frames read back swapped", VPACK,
     "bf16_raw(dims.clone(), frame_of(&s, 0, inner))", "bf16_raw(dims.clone(), frame_of(&s, 1, inner))", VPACK_TESTS),
    ("vision pack: BF16 by truncation, not nearest even", VPACK,
     "v.iter().map(|x| bf16::from_f32(*x).to_bits()).collect()", "v.iter().map(|x| (x.to_bits() >> 16) as u16).collect()", VPACK_TESTS),
    ("vision pack: deepstack list named by block, not by place", VPACK,
     "(true, Some(l)) => Some(self.deepstack.iter().position(|&b| b == l)?),", "(true, Some(l)) => Some(l),", VPACK_TESTS),
    ("vision pack: plain tensors in ggml order, not row-major", VPACK,
     "Op::Plain => (dims.iter().rev().copied().collect::<Vec<u64>>(), b),", "Op::Plain => (dims.clone(), b),", VPACK_TESTS),
    ("vision pack: gemma3 q_proj under another name", VPACK,
     '"vision_tower.vision_model.encoder.layers.{i}.self_attn.q_proj.weight",',
     '"vision_tower.vision_model.encoder.layers.{i}.self_attn.query.weight",', VPACK_TESTS),
    ("vision pack: gemma3 pooling side, not grid / side", VPACK,
     "json!(grid / per_side),", "json!(per_side),", VPACK_TESTS),
    ("vision pack: SigLIP eps default 1e-5", VPACK,
     "json!(1e-6),\n            \"transformers SiglipVisionConfig", "json!(1e-5),\n            \"transformers SiglipVisionConfig", VPACK_TESTS),
    ("vision pack: qwen3vl eps not from the text config", VPACK,
     "match lookup(&text, \"rms_norm_eps\") {", "match lookup(&text, \"rms_norm_eps\").filter(|_| false) {", VPACK_TESTS),
    ("vision pack: gelu_pytorch_tanh read as GELU-quick", VPACK,
     'Some("gelu_pytorch_tanh") | Some("gelu_new") => Stated {\n            value: json!(true),',
     'Some("gelu_pytorch_tanh") | Some("gelu_new") => Stated {\n            value: json!(false),', VPACK_TESTS),
    ("vision pack: verify does not compare the stored bytes", VPACK,
     "if let Some(i) = (0..stored.len()).find(|&i| remade.get(i) != Some(&stored[i])) {",
     "if let Some(i) = (0..stored.len()).find(|&i| remade.get(i) != Some(&stored[i])).filter(|_| false) {", VPACK_TESTS),
    ("vision pack: Qwen2.5-VL layout not refused", VPACK,
     '        "model.visual.merger.ln_q.",', '        "model.visual.merger.ln_q.-",', VPACK_TESTS),
]


# Q5_K kernels (x86, every level against the scalar reference in quant/x86/tests.rs and
# matmul's batch-width tests); run: scripts/mutants.py q5k. The aarch64 ones are checked
# under qemu by hand (scripts/test-arm.sh runs the same tests there).
KQ = "crates/onebit-kernels/src/quant/x86/k_quants.rs"
WK = "crates/onebit-kernels/src/quant/x86/wide_k.rs"
KERNEL_TESTS = ["-p", "onebit-kernels", "--lib", "--", "quant::", "matmul::"]
MUTANTS += [
    ("q5k: fifth bit's mask shifted (with_fifth_bits, every x86 Q5_K kernel)", KQ,
     "let b = 1i8 << (2 * c);", "let b = 1i8 << ((2 * c + 1) % 8);", KERNEL_TESTS),
    ("q5k: fifth bits of the next run (interleaved one-token and few-row kernel)", KQ,
     "q45_codes::<K>(v, qh, cc)", "q45_codes::<K>(v, qh, (cc + 1) % 4)", KERNEL_TESTS),
    ("q5k: fifth bits of the next run (standard rows past the last group)", KQ,
     "q45_codes::<K>(ld(bx.add(qo + 32 * c)), qh, c)", "q45_codes::<K>(ld(bx.add(qo + 32 * c)), qh, (c + 1) % 4)",
     KERNEL_TESTS),
    ("q5k: fifth bits of the next run (wide kernel's interleaved expansion)", WK,
     "q45_codes::<K>(v, qh, c)", "q45_codes::<K>(v, qh, (c + 1) % 4)", KERNEL_TESTS),
    ("q5k: fifth bits of the next run (wide kernel's standard rows)", WK,
     "q45_codes::<K>(ld(bx.add(qo + 32 * c)), qh, c)", "q45_codes::<K>(ld(bx.add(qo + 32 * c)), qh, (c + 1) % 4)",
     KERNEL_TESTS),
    ("q5k: a row's scales taken from its neighbour (interleaved kernel)", KQ,
     "let a = ld(bx.add(32));",
     "let a = if K == 5 { _mm256_permutevar8x32_epi32(ld(bx.add(32)), _mm256_setr_epi32(1, 2, 3, 4, 5, 6, 7, 0)) } else { ld(bx.add(32)) };",
     KERNEL_TESTS),
    ("q5k: the last tail row skipped", KQ,
     "tile_q4_k::<1, 1, K>(ops, r, t, out, os);",
     "if K != 5 || r + 1 < nrows { tile_q4_k::<1, 1, K>(ops, r, t, out, os); }", KERNEL_TESTS),
    ("q5k: float terms reordered ((acc + d * isum) - dmin * summ)", KQ,
     """                    let term = _mm256_sub_ps(
                        _mm256_mul_ps(d, _mm256_cvtepi32_ps(isum[t])),
                        _mm256_mul_ps(dmin, _mm256_cvtepi32_ps(summ[t])),
                    );
                    acc[t] = _mm256_add_ps(acc[t], term);""",
     """                    let term = _mm256_sub_ps(
                        _mm256_mul_ps(d, _mm256_cvtepi32_ps(isum[t])),
                        _mm256_mul_ps(dmin, _mm256_cvtepi32_ps(summ[t])),
                    );
                    acc[t] = if K == 5 {
                        _mm256_sub_ps(
                            _mm256_add_ps(acc[t], _mm256_mul_ps(d, _mm256_cvtepi32_ps(isum[t]))),
                            _mm256_mul_ps(dmin, _mm256_cvtepi32_ps(summ[t])),
                        )
                    } else {
                        _mm256_add_ps(acc[t], term)
                    };""", KERNEL_TESTS),
    ("q5k: AVX2 sums 8 code vectors in i16 (overflows; interleaved kernel)", KQ,
     "let run16 = if K == 5 { 4 } else { 8 };", "let run16 = 8;", KERNEL_TESTS),
    ("q5k: AVX2 sums 8 code vectors in i16 (overflows; wide kernel)", WK,
     "                            5 => 4,\n", "                            5 => 8,\n", KERNEL_TESTS),
]


# Attention kernels (their tests: every level against the scalar reference,
# each row of a step against the row alone); run: scripts/mutants.py attention:
ATTN_X86 = "crates/onebit-kernels/src/attention/x86.rs"
ATTN_MOD = "crates/onebit-kernels/src/attention/mod.rs"
ATTN_TESTS = ["-p", "onebit-kernels", "--lib", "attention::"]
MUTANTS += [
    ("attention: the last vector of a tile stops one position short (causal mask off by one)", ATTN_X86,
     "let hi: [usize; G] = core::array::from_fn(|g| ranges[g].1 - from);",
     "let hi: [usize; G] = core::array::from_fn(|g| ranges[g].1 - from - (g + 1 == G && ranges[g].1 - ranges[g].0 > 1) as usize);",
     ATTN_TESTS),
    ("attention: a vector weighs the V row just past its range", ATTN_X86,
     "!MASKED || (self.lo[g] <= i && i < self.hi[g])", "!MASKED || (self.lo[g] <= i && i <= self.hi[g])", ATTN_TESTS),
    ("attention: a vector's softmax max and sum over its neighbour's range", ATTN_X86,
     "&mut scores[g * len + lo[g]..g * len + hi[g]],",
     "&mut scores[g * len + lo[g.saturating_sub(1)]..g * len + hi[g.saturating_sub(1)]],", ATTN_TESTS),
    ("attention: a row's running state started from its neighbour's first block", ATTN_MOD,
     "if b == blocks_of(self.span(u, j)).start {", "if b == blocks_of(self.span(u, j.saturating_sub(1))).start {",
     ATTN_TESTS),
    ("attention: the odd vector of a 512-bit pair scored as the even one", ATTN_X86,
     "for (g, [a, b, c, d]) in [(2 * m, lo), (2 * m + 1, hi)] {",
     "for (g, [a, b, c, d]) in [(2 * m, lo), (2 * m + 1, lo)] {", ATTN_TESTS),
    ("attention: a split unit's fold starts from the next vector's partial", ATTN_MOD,
     "run.copy_from_slice(&parts[at..at + ph]);",
     "run.copy_from_slice(&parts[at + ph..at + 2 * ph]);", ATTN_TESTS),
]


# The F16 weight kernels (their tests: every level against the scalar
# reference bit for bit, on partial tiles, panels and input blocks; each row
# against the row alone); run: scripts/mutants.py f16mm:
F16_MOD = "crates/onebit-kernels/src/f16mm/mod.rs"
F16_X86 = "crates/onebit-kernels/src/f16mm/x86.rs"
F16_TESTS = ["-p", "onebit-kernels", "--lib", "f16mm::"]
MUTANTS += [
    ("f16mm: AVX-512 multiply then add, unfused (each step rounded twice)", F16_X86,
     "acc[i][v] = _mm512_fmadd_ps(w[v], xv, acc[i][v]);",
     "acc[i][v] = _mm512_add_ps(_mm512_mul_ps(w[v], xv), acc[i][v]);", F16_TESTS),
    ("f16mm: AVX2 upper 8 columns weighted by the lower 8's weights", F16_X86,
     "acc[i][1] = _mm256_fmadd_ps(w1, xv, acc[i][1]);", "acc[i][1] = _mm256_fmadd_ps(w0, xv, acc[i][1]);",
     F16_TESTS),
    ("f16mm: the second panel of an AVX-512 tile reads the first panel (wrong column panel)", F16_X86,
     "a.w.add(v * a.ps + k * NR) as *const __m256i", "a.w.add(k * NR) as *const __m256i", F16_TESTS),
    ("f16mm: a partial row tile skips its last row", F16_MOD,
     "(tiles.run)(&a, m, np);", "(tiles.run)(&a, if m < tiles.mr { m.max(2) - 1 } else { m }, np);", F16_TESTS),
    ("f16mm: each input block restarts the chain from zero", F16_MOD,
     "first: k0 == 0,", "first: true,", F16_TESTS),
    ("f16mm: the partial last panel's results not copied back", F16_MOD,
     "*o.add(i * rows + j) = tmp[i * ts + j];", "let _ = tmp[i * ts + j];", F16_TESTS),
    ("f16mm: the reference sums unfused", F16_MOD,
     "acc = f16_to_f32(wk).mul_add(xk, acc);", "acc += f16_to_f32(wk) * xk;", F16_TESTS),
]


# The all-keys attention kernel (its tests: every level against its reference
# bit for bit, partial tiles and blocks); run: scripts/mutants.py attend_full:
FULL = "crates/onebit-kernels/src/attention/full.rs"
FULL_TESTS = ["-p", "onebit-kernels", "--lib", "attention::full::"]
MUTANTS += [
    ("attend_full: AVX-512 scores multiply then add, unfused", FULL,
     "*ri = _mm512_fmadd_ps(_mm512_set1_ps(*qp.add(i)), kv, *ri);",
     "*ri = _mm512_add_ps(_mm512_mul_ps(_mm512_set1_ps(*qp.add(i)), kv), *ri);", FULL_TESTS),
    ("attend_full: the running max restarts at each block", FULL,
     "    let mut mn = m;\n    for &x in si.iter() {",
     "    let mut mn = f32::NEG_INFINITY;\n    for &x in si.iter() {", FULL_TESTS),
    ("attend_full: earlier blocks' value sums not rescaled", FULL,
     "*x = s * alpha[i];", "*x = s;", FULL_TESTS),
    ("attend_full: a partial tile's last row computed from its neighbour's query", FULL,
     "let qr = &c.q[(r0 + i.min(rows - 1)) * nh * dk + h * dk..][..dk];",
     "let qr = &c.q[(r0 + i.min(rows.saturating_sub(2))) * nh * dk + h * dk..][..dk];", FULL_TESTS),
    ("attend_full: the last key of a partial score tile dropped", FULL,
     "let w = L.min(kn - j0);", "let w = if kn - j0 < L { kn - j0 - 1 } else { L };", FULL_TESTS),
    ("attend_full: AVX-512 softmax's running max restarts at each block", FULL,
     "let mut mx = _mm512_set1_ps(m);", "let mut mx = _mm512_set1_ps(f32::NEG_INFINITY);", FULL_TESTS),
    ("attend_full: AVX-512 softmax leaves a partial block's tail out of the sum", FULL,
     "sum = _mm512_mask_add_ps(sum, tail, sum, e);", "sum = _mm512_mask_add_ps(sum, 0, sum, e);", FULL_TESTS),
    ("attend_full: a key lands in its neighbour's lane of the transposed tile", FULL,
     "+ d * L + j % L) = x", "+ d * L + (j + 1) % L) = x", FULL_TESTS),
    ("attend_full: AVX2 softmax leaves a partial block's tail out of the sum", FULL,
     "            lanes[j] += *x;\n", "", FULL_TESTS),
    ("attend_full: AVX2 value tile's second pass weighted by the first pass's rows", FULL,
     "let pj = _mm256_set1_ps(*p.add((h0 + i) * KB + j));", "let pj = _mm256_set1_ps(*p.add(i * KB + j));", FULL_TESTS),
    ("attend_full: AVX2 score tile's upper 8 keys scored against the lower 8", FULL,
     "ri[1] = _mm256_fmadd_ps(q, k1, ri[1]);", "ri[1] = _mm256_fmadd_ps(q, k0, ri[1]);", FULL_TESTS),
    ("attend_full: the parallel K/V copy leaves the last key of each run behind", FULL,
     "((run + 1) * L * COPY_TILES).min(n)", "((run + 1) * L * COPY_TILES - 1).min(n)", FULL_TESTS),
    ("exp16: scores below the range not flushed to zero", "crates/onebit-kernels/src/ops.rs",
     "_mm512_maskz_mov_ps(!below, ", "_mm512_maskz_mov_ps(0xFFFF, ",
     ["-p", "onebit-kernels", "--lib", "ops::tests::exp_and"]),
]


def main():
    pick = sys.argv[1] if len(sys.argv) > 1 else ""
    survived = 0
    for name, rel, old, new, target in MUTANTS:
        if pick not in name:
            continue
        path = ROOT / rel
        src = path.read_text()
        if src.count(old) != 1:
            print(f"STALE     {name}: text not found exactly once in {rel}")
            survived += 1
            continue
        path.write_text(src.replace(old, new))
        try:
            r = subprocess.run(["cargo", "test", "-q", *target], cwd=ROOT, capture_output=True, text=True)
        finally:
            path.write_text(src)
        if "could not compile" in r.stderr:
            print(f"BROKEN    {name}: the mutant does not compile", flush=True)
            survived += 1
            continue
        caught = r.returncode != 0
        survived += not caught
        print(f"{'CAUGHT  ' if caught else 'SURVIVED'}  {name}", flush=True)
    sys.exit(1 if survived else 0)


if __name__ == "__main__":
    main()
