//! A split GGUF (llama.cpp's gguf-split: `PREFIX-0000k-of-0000N.gguf`) loads
//! from its first part as the file it was split from: the same tensors and
//! the same logits, bit for bit. A later part given first, or a part that
//! is missing, is refused by name. The parts in `testdata/split/` were made
//! by llama.cpp's own `llama-gguf-split` (see the README there).

use onebit_formats::gguf::Gguf;
use onebit_kernels::kv::KvType;
use onebit_kernels::Precision;
use onebit_model::{load, ExecConfig, Logits};
use onebit_testdata::{dir, Fixture, TempDir};

fn exec() -> ExecConfig {
    ExecConfig {
        threads: 2,
        precision: Precision::Quantized,
        max_context: 128,
        kv_type: KvType::F32,
    }
}

fn part(k: usize) -> std::path::PathBuf {
    dir().join(format!("split/qwen2-Q8_0-{k:05}-of-00003.gguf"))
}

#[test]
fn a_split_gguf_reads_as_the_file_it_was_split_from() {
    let fx = Fixture::new("qwen2");
    let whole_path = fx.dir.join("Q8_0.gguf");
    let whole = Gguf::open(&whole_path).unwrap();
    let split = Gguf::open_all(part(1)).unwrap();
    assert_eq!(split.files().len(), 3);
    assert_eq!(split.tensors.len(), whole.tensors.len());
    for t in &whole.tensors {
        let s = split
            .tensor(&t.name)
            .unwrap_or_else(|| panic!("{} missing from the split", t.name));
        assert_eq!((&s.dims, s.dtype), (&t.dims, t.dtype), "{}", t.name);
        assert_eq!(
            &split.tensor_bytes(s)[..],
            &whole.tensor_bytes(t)[..],
            "{}",
            t.name
        );
    }
    // Tensors really come from the later parts.
    assert!(split.tensors.iter().any(|t| t.part == 2));

    let toks = fx.tokens("tokens");
    let run = |path: &std::path::Path| {
        let (model, _) = load::load(path, &exec()).unwrap();
        model
            .forward(&mut model.new_state(), &toks, Logits::All)
            .unwrap()
    };
    let a = run(&whole_path);
    let b = run(&part(1));
    assert_eq!(a.len(), toks.len() * fx.n_vocab());
    assert!(
        a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits()),
        "the split's logits differ from the whole file's"
    );
}

#[test]
fn a_later_part_or_a_missing_part_is_refused_by_name() {
    let err = load::open(&part(2))
        .err()
        .expect("part 2 refused")
        .to_string();
    assert!(
        err.contains("split.no")
            && err.contains("part 2 of 3")
            && err.contains("qwen2-Q8_0-00001-of-00003.gguf"),
        "{err}"
    );

    let tmp = TempDir::new("split-missing");
    for k in [1, 3] {
        std::fs::copy(part(k), tmp.path().join(part(k).file_name().unwrap())).unwrap();
    }
    let first = tmp.path().join("qwen2-Q8_0-00001-of-00003.gguf");
    let err = load::open(&first)
        .err()
        .expect("missing part refused")
        .to_string();
    assert!(
        err.contains("part 2")
            && err.contains("qwen2-Q8_0-00002-of-00003.gguf")
            && err.contains("not there"),
        "{err}"
    );

    // Renamed out of gguf-split's pattern, the other parts cannot be found.
    let odd = tmp.path().join("renamed.gguf");
    std::fs::copy(part(1), &odd).unwrap();
    let err = load::open(&odd)
        .err()
        .expect("renamed part refused")
        .to_string();
    assert!(
        err.contains("does not end in `-00001-of-00003.gguf`"),
        "{err}"
    );
}
