//! Qwen3-VL's vision tower and its text side against llama.cpp's mtmd on
//! the random-weight fixture `testdata/llamacpp/qwen3vl-vision/` (made by
//! `scripts/gen-vision-fixtures.sh qwen3vl-vision`; tolerances and their
//! reasons in its README, section "qwen3vl-vision"):
//!
//! - the tower: image embeddings within 1e-6 x max |e| of an independent
//!   float64 NumPy forward (`numpy.embd.bin`) and 2e-3 x max |e| of
//!   llama.cpp's (`llamacpp.embd.bin`);
//! - the text side (IMROPE positions, deepstack): the logits of every text
//!   position of a prompt holding one image (`llamacpp`) and two images
//!   (`llamacpp2`), with llama.cpp's rows put in and with ours, within the
//!   README's bounds; where the next text position stands after each image
//!   is mtmd's (`n_pos` of its chunks);
//! - each rule moves the logits far beyond the bound (image rows at text
//!   positions, deepstack off, deepstack features in the wrong layers), so
//!   the comparison tells the rules apart;
//! - batch == sequential: one call, chunk by chunk (each image whole), and
//!   beside another sequence give the same bits.
//!
//! And Qwen3.5's vision checkpoints on `qwen35-vision/`: the qwen35 text
//! family (IMROPE attention layers, delta-net layers) with a tower without
//! deepstack, against mtmd the same way.
//!
//! The pixels are the fixture's 8-bit image normalized here, by the test's
//! own arithmetic: `(v / 255 - mean) / std` per channel, CHW.

use std::path::PathBuf;

use onebit_kernels::kv::KvType;
use onebit_kernels::{Pool, Precision};
use onebit_model::vision::{ImageEmbeddings, ResizeFilter, VisionTower};
use onebit_model::{load, Embeds, ExecConfig, Logits, Model, SeqInput};
use onebit_testdata::read_f32;

/// Qwen3-VL: the qwen3vl text family, a tower with two deepstack layers.
const QWEN3VL: &str = "qwen3vl-vision";
/// Qwen3.5's vision checkpoints: the qwen35 text family (delta-net and
/// gated attention layers), a tower without deepstack.
const QWEN35: &str = "qwen35-vision";

fn dir_of(fx: &str) -> PathBuf {
    onebit_testdata::fixture(fx)
}

fn dir() -> PathBuf {
    dir_of(QWEN3VL)
}

fn meta() -> serde_json::Value {
    meta_of(QWEN3VL)
}

fn meta_of(fx: &str) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(dir_of(fx).join("meta.json")).unwrap()).unwrap()
}

fn tower() -> VisionTower {
    tower_of(QWEN3VL)
}

fn tower_of(fx: &str) -> VisionTower {
    VisionTower::open(dir_of(fx).join("mmproj.gguf")).unwrap()
}

/// The image's width and height (meta.json; both fixtures' are the same).
fn image_size() -> (usize, usize) {
    let m = meta();
    let w = m["image"]["width"].as_u64().unwrap() as usize;
    let h = m["image"]["height"].as_u64().unwrap() as usize;
    (w, h)
}

/// A fixture image (`image.rgb`, `image2.rgb`) as the encoder's input.
fn pixels(t: &VisionTower, file: &str) -> Vec<f32> {
    pixels_of(QWEN3VL, t, file)
}

fn pixels_of(fx: &str, t: &VisionTower, file: &str) -> Vec<f32> {
    let p = t.preprocess();
    let (w, h) = image_size();
    let rgb = std::fs::read(dir_of(fx).join(file)).unwrap();
    assert_eq!(rgb.len(), w * h * 3);
    let mut out = vec![0f32; 3 * w * h];
    for c in 0..3 {
        for i in 0..w * h {
            out[c * w * h + i] = (rgb[i * 3 + c] as f32 / 255.0 - p.mean[c]) / p.std[c];
        }
    }
    out
}

fn encode(t: &VisionTower, file: &str) -> ImageEmbeddings {
    encode_of(QWEN3VL, t, file)
}

fn encode_of(fx: &str, t: &VisionTower, file: &str) -> ImageEmbeddings {
    let (w, h) = image_size();
    t.encode_sized(&Pool::new(2), &pixels_of(fx, t, file), w as u32, h as u32)
        .unwrap()
}

enum Chunk {
    Text(Vec<u32>),
    Image { n_tokens: usize, n_pos: usize },
}

/// mtmd's chunks of a run (`llamacpp`: one image, `llamacpp2`: two).
fn chunks(run: &str) -> Vec<Chunk> {
    chunks_of(QWEN3VL, run)
}

fn chunks_of(fx: &str, run: &str) -> Vec<Chunk> {
    let file = dir_of(fx).join(format!("{run}.chunks.json"));
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(file).unwrap()).unwrap();
    assert_eq!(v["non_causal"], false, "mtmd decoded the image causally");
    v["chunks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| match c["type"].as_str().unwrap() {
            "text" => Chunk::Text(
                c["tokens"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|t| t.as_u64().unwrap() as u32)
                    .collect(),
            ),
            _ => Chunk::Image {
                n_tokens: c["n_tokens"].as_u64().unwrap() as usize,
                n_pos: c["n_pos"].as_u64().unwrap() as usize,
            },
        })
        .collect()
}

/// The prompt's ids (placeholder 0 at image rows), where the images sit,
/// which rows are text, and the position mtmd's next token would take
/// (its n_past after the last chunk).
fn prompt(run: &str) -> (Vec<u32>, Vec<usize>, Vec<usize>, usize) {
    prompt_of(QWEN3VL, run)
}

fn prompt_of(fx: &str, run: &str) -> (Vec<u32>, Vec<usize>, Vec<usize>, usize) {
    let (mut ids, mut at, mut text, mut n_past) = (Vec::new(), Vec::new(), Vec::new(), 0);
    for c in chunks_of(fx, run) {
        match c {
            Chunk::Text(t) => {
                text.extend(ids.len()..ids.len() + t.len());
                n_past += t.len();
                ids.extend(t);
            }
            Chunk::Image { n_tokens, n_pos } => {
                at.push(ids.len());
                ids.extend(std::iter::repeat_n(0, n_tokens));
                n_past += n_pos;
            }
        }
    }
    (ids, at, text, n_past)
}

/// The text model as llama.cpp ran it: f32 weights and activations, F32 KV,
/// a 128-token context.
fn text_model() -> Model {
    text_model_of(QWEN3VL)
}

fn text_model_of(fx: &str) -> Model {
    let exec = ExecConfig {
        threads: 2,
        precision: Precision::Float,
        max_context: 128,
        kv_type: KvType::F32,
    };
    load::load(&dir_of(fx).join("text.gguf"), &exec).unwrap().0
}

fn max_abs(x: &[f32]) -> f32 {
    x.iter().fold(0f32, |m, v| m.max(v.abs()))
}

fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter().zip(b).fold(0f32, |m, (x, y)| m.max((x - y).abs()))
}

/// The grid of the fixture's image: 2 x 2 patches a token.
fn grid() -> (usize, usize) {
    let (w, h) = image_size();
    let p = tower().preprocess();
    // The learned grid is image_size / patch a side; the tower's default
    // input is that grid, so the patch is its width over that side.
    let patch = meta()["vision_hparams"]["patch_size"].as_u64().unwrap() as usize;
    assert_eq!(p.width as usize % patch, 0);
    (w / patch / 2, h / patch / 2)
}

/// Logits of the text positions of `run`, with `rows[i]` as image i's rows
/// at `grid` (None: consecutive positions).
fn text_logits(
    model: &Model,
    run: &str,
    rows: &[&[f32]],
    grid: Option<(usize, usize)>,
) -> Vec<f32> {
    text_logits_of(QWEN3VL, model, run, rows, grid)
}

fn text_logits_of(
    fx: &str,
    model: &Model,
    run: &str,
    rows: &[&[f32]],
    grid: Option<(usize, usize)>,
) -> Vec<f32> {
    let (ids, at, text, _) = prompt_of(fx, run);
    assert_eq!(at.len(), rows.len());
    let spans: Vec<Embeds> = at
        .iter()
        .zip(rows)
        .map(|(&at, r)| Embeds {
            at,
            rows: r,
            bidirectional: false,
            grid,
        })
        .collect();
    let mut st = model.new_state();
    let all = model
        .forward_embeds(&mut st, &ids, &spans, Logits::All)
        .unwrap();
    let v = model.sem.dims.n_vocab;
    text.iter()
        .flat_map(|&p| all[p * v..(p + 1) * v].to_vec())
        .collect()
}

/// llama.cpp's rows of `run`, one slice per image.
fn llamacpp_rows(model: &Model, run: &str) -> Vec<Vec<f32>> {
    llamacpp_rows_of(QWEN3VL, model, run)
}

fn llamacpp_rows_of(fx: &str, model: &Model, run: &str) -> Vec<Vec<f32>> {
    let all = read_f32(dir_of(fx).join(format!("{run}.embd.bin")));
    let n: usize = chunks_of(fx, run)
        .iter()
        .map(|c| match c {
            Chunk::Image { n_tokens, .. } => *n_tokens,
            Chunk::Text(_) => 0,
        })
        .sum();
    let width = model.sem.input_width();
    assert_eq!(all.len(), n * width);
    let per = all.len() / prompt_of(fx, run).1.len();
    all.chunks(per).map(<[f32]>::to_vec).collect()
}

#[test]
fn tower_embeddings_match_numpy_and_llamacpp() {
    let t = tower();
    let p = t.preprocess();
    assert_eq!(p.projector, "qwen3vl_merger");
    assert_eq!(p.filter, ResizeFilter::Bicubic);
    assert_eq!(t.markers().begin, "<|vision_start|>");
    assert!(!t.bidirectional().value);
    // mtmd's fit keeps the fixture's image (multiples of 2 patches, within
    // 8 .. 4096 tokens).
    let (w, h) = image_size();
    assert_eq!(t.fit(w as u32, h as u32), (w as u32, h as u32));
    // ... rounds other sizes to multiples of 2 patches and scales them into
    // the token limits.
    assert_eq!(t.fit(30, 17), (32, 16));
    assert_eq!(t.fit(8, 8), (24, 24));
    let e = encode(&t, "image.rgb");
    let (nx, ny) = grid();
    // [merger | deepstack 0 | deepstack 2], a row of nx tokens per 2 patch rows.
    assert_eq!(
        (e.n_tokens, e.n_embd, e.grid),
        (nx * ny, 3 * 64, Some((nx, ny)))
    );
    let np = read_f32(dir().join("numpy.embd.bin"));
    let m = max_abs(&np);
    let d = max_diff(&e.rows, &np);
    println!("qwen3vl tower vs numpy float64: max |diff| {d:e} (M {m})");
    assert!(d <= 1e-6 * m, "vs numpy: {d} > 1e-6 x {m}");
    let ll = read_f32(dir().join("llamacpp.embd.bin"));
    let d = max_diff(&e.rows, &ll);
    println!("qwen3vl tower vs llama.cpp: max |diff| {d:e}");
    assert!(d <= 2e-3 * m, "vs llama.cpp: {d} > 2e-3 x {m}");
    // A size that is not a multiple of 2 patches is refused by name.
    let px = pixels(&t, "image.rgb");
    let err = t
        .encode_sized(&Pool::new(1), &px[..3 * 36 * 12], 36, 12)
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("multiples of 8"), "{err}");
}

#[test]
fn text_semantics_are_llamacpps() {
    let model = text_model();
    let s = &model.sem;
    assert_eq!(s.family, "qwen3vl");
    assert_eq!(s.rope_full.value.sections, Some([4, 2, 2, 0]));
    assert_eq!(s.body.value.deepstack, 2);
    assert_eq!(s.input_width(), 3 * 64);
    let lines = s.lines().join("\n");
    for want in [
        "(IMROPE) sections [4, 2, 2, 0]",
        "GGUF qwen3vl.rope.dimension_sections",
        "deepstack: image rows carry 2 features",
        "GGUF qwen3vl.n_deepstack_layers",
    ] {
        assert!(lines.contains(want), "{want} missing from:\n{lines}");
    }
    // The tower fits this text model and no single-axis one.
    let t = tower();
    t.check_text_model(s).unwrap();
    let qwen3 = load::open(&onebit_testdata::fixture("qwen3").join("f32.gguf"))
        .unwrap()
        .sem;
    let err = t.check_text_model(&qwen3).err().unwrap().to_string();
    assert!(err.contains("IMROPE") && err.contains("qwen3"), "{err}");
    let mut other = s.clone();
    other.body.value.deepstack = 1;
    let err = t.check_text_model(&other).err().unwrap().to_string();
    assert!(
        err.contains("gives 2 deepstack features") && err.contains("adds 1"),
        "{err}"
    );
}

#[test]
fn logits_match_llamacpp() {
    let model = text_model();
    let t = tower();
    for (run, files) in [
        ("llamacpp", &["image.rgb"][..]),
        ("llamacpp2", &["image.rgb", "image2.rgb"][..]),
    ] {
        let reference = read_f32(dir().join(format!("{run}.logits.bin")));
        let m = max_abs(&reference);
        // llama.cpp's own image rows: the text side alone.
        let ll = llamacpp_rows(&model, run);
        let ll: Vec<&[f32]> = ll.iter().map(Vec::as_slice).collect();
        let d = max_diff(&text_logits(&model, run, &ll, Some(grid())), &reference);
        println!("{run}, llama.cpp's rows: max |diff| {d:e} (M {m})");
        assert!(d <= 1e-4 * m, "{run}: {d} > 1e-4 x {m}");
        // Our rows, end to end.
        let ours: Vec<ImageEmbeddings> = files.iter().map(|f| encode(&t, f)).collect();
        let rows: Vec<&[f32]> = ours.iter().map(|e| &e.rows[..]).collect();
        let d = max_diff(&text_logits(&model, run, &rows, ours[0].grid), &reference);
        println!("{run}, our rows: max |diff| {d:e}");
        assert!(d <= 2e-3 * m, "{run}: {d} > 2e-3 x {m}");
    }
}

#[test]
fn the_text_after_an_image_stands_where_mtmd_puts_it() {
    // mtmd's n_past after each image chunk grows by its n_pos, max(nx, ny),
    // not by its rows; the state's next text position is that n_past.
    let model = text_model();
    let t = tower();
    let (nx, ny) = grid();
    for run in ["llamacpp", "llamacpp2"] {
        for c in chunks(run) {
            if let Chunk::Image { n_tokens, n_pos } = c {
                assert_eq!((n_tokens, n_pos), (nx * ny, nx.max(ny)));
            }
        }
        let (ids, at, _, n_past) = prompt(run);
        let e = encode(&t, "image.rgb");
        let spans: Vec<Embeds> = at.iter().map(|&a| e.at(a)).collect();
        let mut st = model.new_state();
        model
            .forward_embeds(&mut st, &ids, &spans, Logits::Last)
            .unwrap();
        assert_eq!(st.pos, ids.len());
        assert_eq!(st.text_pos(st.pos), n_past, "{run}");
        // A cut inside an image is refused; one after it keeps its grid.
        let mut cut = st.clone();
        assert!(!cut.truncate(at[0] + 1));
        assert!(cut.truncate(at[0] + nx * ny));
        assert_eq!(cut.text_pos(cut.pos), at[0] + nx.max(ny));
        // A prefix copy (the prefix cache's) keeps the grids it holds.
        let pre = st.prefix(at[0] + nx * ny);
        assert_eq!(pre.text_pos(pre.pos), at[0] + nx.max(ny));
        assert!(st.prefix(at[0]).grids.is_empty());
    }
}

#[test]
fn each_rule_moves_the_logits_beyond_the_bound() {
    // The fixture tells the rules apart: reverting one moves the logits far
    // beyond the 1e-4 x M the text side is held to.
    let model = text_model();
    let e = model.sem.dims.n_embd;
    for run in ["llamacpp", "llamacpp2"] {
        let reference = read_f32(dir().join(format!("{run}.logits.bin")));
        let m = max_abs(&reference);
        let ll = llamacpp_rows(&model, run);
        let far = |what: &str, rows: &[Vec<f32>], grid: Option<(usize, usize)>| {
            let rows: Vec<&[f32]> = rows.iter().map(Vec::as_slice).collect();
            let d = max_diff(&text_logits(&model, run, &rows, grid), &reference);
            println!("{run}, {what}: max |diff| {d:e}");
            assert!(d > 1e-2 * m, "{run}: {what} is indistinguishable ({d})");
        };
        // Image rows at consecutive text positions, the text after them too.
        far("image rows at text positions", &ll, None);
        // The grid transposed: rows and columns swapped.
        let (nx, ny) = grid();
        far("grid transposed", &ll, Some((ny, nx)));
        // Deepstack off, and its two features in each other's layer.
        let edit = |f: &dyn Fn(&mut [f32])| -> Vec<Vec<f32>> {
            ll.iter()
                .map(|r| {
                    let mut r = r.clone();
                    r.chunks_exact_mut(3 * e).for_each(f);
                    r
                })
                .collect()
        };
        far(
            "deepstack off",
            &edit(&|row| row[e..].fill(0.0)),
            Some(grid()),
        );
        far(
            "deepstack features swapped",
            &edit(&|row| {
                let (a, b) = row[e..].split_at_mut(e);
                a.swap_with_slice(b);
            }),
            Some(grid()),
        );
    }
}

#[test]
fn batch_equals_sequential() {
    let model = text_model();
    let t = tower();
    let e1 = encode(&t, "image.rgb");
    let e2 = encode(&t, "image2.rgb");
    let (ids, at, _, _) = prompt("llamacpp2");
    let spans = [e1.at(at[0]), e2.at(at[1])];
    let v = model.sem.dims.n_vocab;
    let mut st = model.new_state();
    let whole = model
        .forward_embeds(&mut st, &ids, &spans, Logits::All)
        .unwrap();
    assert_eq!(whole.len(), ids.len() * v);
    // Chunk by chunk: text one token at a time, each image whole.
    let mut st = model.new_state();
    let mut seq = Vec::new();
    let mut i = 0;
    while i < ids.len() {
        let img = [(&e1, at[0]), (&e2, at[1])]
            .into_iter()
            .find(|(_, a)| *a == i);
        match img {
            Some((e, _)) => {
                let end = i + e.n_tokens;
                seq.extend(
                    model
                        .forward_embeds(&mut st, &ids[i..end], &[e.at(0)], Logits::All)
                        .unwrap(),
                );
                i = end;
            }
            None => {
                seq.extend(model.forward(&mut st, &ids[i..i + 1], Logits::All).unwrap());
                i += 1;
            }
        }
    }
    assert!(whole == seq, "batched and sequential logits differ");
    // Beside another sequence (the one-image prompt) in one call.
    let (ids1, at1, _, _) = prompt("llamacpp");
    let mut a = model.new_state();
    let mut b = model.new_state();
    let mut seqs = [
        SeqInput {
            state: &mut b,
            tokens: &ids1,
            want: Logits::All,
        },
        SeqInput {
            state: &mut a,
            tokens: &ids,
            want: Logits::All,
        },
    ];
    let one = [e2.at(at1[0])];
    let out = model
        .forward_batch_embeds(&mut seqs, &[&one, &spans])
        .unwrap();
    assert!(out[1] == whole, "beside another sequence the logits differ");
    let mut alone = model.new_state();
    let single = model
        .forward_embeds(&mut alone, &ids1, &one, Logits::All)
        .unwrap();
    assert!(out[0] == single, "the other sequence's logits differ");
    assert_eq!(b.grids, alone.grids);
}

#[test]
fn rows_that_do_not_fit_are_refused() {
    let model = text_model();
    let (ids, at, _, _) = prompt("llamacpp");
    let e = encode(&tower(), "image.rgb");
    let run = |span: Embeds| {
        let mut st = model.new_state();
        model
            .forward_embeds(&mut st, &ids, &[span], Logits::Last)
            .err()
            .map(|e| e.to_string())
    };
    // Rows of n_embd only: the deepstack features are missing.
    let short: Vec<f32> = e
        .rows
        .chunks(3 * 64)
        .flat_map(|r| r[..64].to_vec())
        .collect();
    let err = run(Embeds {
        rows: &short[..64 * 7],
        ..e.at(at[0])
    })
    .unwrap();
    assert!(
        err.contains("input width 192") && err.contains("2 deepstack"),
        "{err}"
    );
    // A grid that is not the rows' count.
    let (nx, ny) = grid();
    let err = run(Embeds {
        grid: Some((nx + 1, ny)),
        ..e.at(at[0])
    })
    .unwrap();
    assert!(err.contains("grid of"), "{err}");
}

#[test]
fn qwen35_vision_checkpoints_match_llamacpp() {
    // Qwen3.5's text side takes the same tower's rows (no deepstack): its
    // attention layers place them by IMROPE, its delta-net layers take them
    // in order.
    let model = text_model_of(QWEN35);
    assert_eq!(model.sem.family, "qwen35");
    assert_eq!(model.sem.rope_full.value.sections, Some([1, 1, 1, 0]));
    assert_eq!(model.sem.input_width(), model.sem.dims.n_embd);
    let t = tower_of(QWEN35);
    t.check_text_model(&model.sem).unwrap();
    // The qwen3vl tower (two deepstack features) does not fit it.
    let err = tower()
        .check_text_model(&model.sem)
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("adds 0"), "{err}");
    let np = read_f32(dir_of(QWEN35).join("numpy.embd.bin"));
    let e = encode_of(QWEN35, &t, "image.rgb");
    let m = max_abs(&np);
    let d = max_diff(&e.rows, &np);
    println!("qwen35 tower vs numpy float64: max |diff| {d:e} (M {m})");
    assert!(d <= 1e-6 * m, "vs numpy: {d} > 1e-6 x {m}");
    for (run, files) in [
        ("llamacpp", &["image.rgb"][..]),
        ("llamacpp2", &["image.rgb", "image2.rgb"][..]),
    ] {
        let reference = read_f32(dir_of(QWEN35).join(format!("{run}.logits.bin")));
        let m = max_abs(&reference);
        let ll = llamacpp_rows_of(QWEN35, &model, run);
        let ll: Vec<&[f32]> = ll.iter().map(Vec::as_slice).collect();
        let at = |rows: &[&[f32]], grid| text_logits_of(QWEN35, &model, run, rows, grid);
        let d = max_diff(&at(&ll, e.grid), &reference);
        println!("qwen35 {run}, llama.cpp's rows: max |diff| {d:e} (M {m})");
        assert!(d <= 1e-4 * m, "{run}: {d} > 1e-4 x {m}");
        let ours: Vec<ImageEmbeddings> = files.iter().map(|f| encode_of(QWEN35, &t, f)).collect();
        let rows: Vec<&[f32]> = ours.iter().map(|e| &e.rows[..]).collect();
        let ours_logits = at(&rows, e.grid);
        let d = max_diff(&ours_logits, &reference);
        println!("qwen35 {run}, our rows: max |diff| {d:e}");
        // llama.cpp's rows are 4.9e-4 x M from the exact (float64 NumPy)
        // tower (its GELU table), and the delta-net layers carry that to
        // the logits: the NumPy rows land as far from llama.cpp as ours,
        // while ours are within 1e-4 x M of the NumPy rows' logits.
        if run == "llamacpp" {
            let dn = max_diff(&at(&[&np[..]], e.grid), &ours_logits);
            println!("qwen35 {run}, our rows vs numpy's rows: max |diff| {dn:e}");
            assert!(dn <= 1e-4 * m, "{run}: {dn} > 1e-4 x {m}");
        }
        assert!(d <= 1e-2 * m, "{run}: {d} > 1e-2 x {m}");
        // The grid matters here too.
        let d = max_diff(&at(&ll, None), &reference);
        println!("qwen35 {run}, image rows at text positions: max |diff| {d:e}");
        assert!(
            d > 1e-2 * m,
            "{run}: grid positions indistinguishable ({d})"
        );
    }
}
