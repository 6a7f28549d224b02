//! Dequantization against vectors produced independently by gguf-py
//! (`scripts/gen_block_vectors.py` writes `tests/data/block_vectors.gguf`):
//! every type must agree bit for bit, including the edge-case blocks (zero,
//! negative, large and subnormal scales; codes all zero or all ones).

use std::collections::BTreeSet;
use std::path::PathBuf;

use onebit_formats::blocks::{dequantize, BlockError};
use onebit_formats::gguf::Gguf;
use onebit_formats::GgmlType;

const ALL_TYPES: &[GgmlType] = &[
    GgmlType::F32,
    GgmlType::F16,
    GgmlType::BF16,
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q8_0,
    GgmlType::Q8_1,
    GgmlType::Q2K,
    GgmlType::Q3K,
    GgmlType::Q4K,
    GgmlType::Q5K,
    GgmlType::Q6K,
    GgmlType::Q8K,
    GgmlType::MXFP4,
];

fn vectors() -> Gguf {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/block_vectors.gguf");
    Gguf::open(&p).unwrap_or_else(|e| panic!("{e} (regenerate with scripts/gen_block_vectors.py)"))
}

fn f32s(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

#[test]
fn every_type_matches_gguf_py_bit_for_bit() {
    let g = vectors();
    for &ty in ALL_TYPES {
        let name = ty.name();
        let raw = g
            .tensor(name)
            .unwrap_or_else(|| panic!("no tensor {name} in the vectors"));
        let exp = g
            .tensor(&format!("{name}.f32"))
            .unwrap_or_else(|| panic!("no tensor {name}.f32"));
        assert_eq!(raw.dtype, ty, "tensor {name}");
        assert_eq!(exp.dtype, GgmlType::F32);
        let n = raw.n_elements() as usize;
        assert_eq!(exp.n_elements() as usize, n, "{name}: element counts");
        let expected = f32s(&g.tensor_bytes(exp));
        let mut got = vec![f32::NAN; n];
        dequantize(ty, &g.tensor_bytes(raw), &mut got).unwrap();
        let mut bad = 0;
        for (i, (g, e)) in got.iter().zip(&expected).enumerate() {
            if g.to_bits() != e.to_bits() {
                if bad < 5 {
                    eprintln!(
                        "{name}[{i}] (block {}): got {g:e}, gguf-py {e:e}",
                        i / ty.block_len()
                    );
                }
                bad += 1;
            }
        }
        assert_eq!(bad, 0, "{name}: {bad} of {n} values differ from gguf-py");
        // The vectors exercise the edge cases they claim to.
        if ty.is_quantized() {
            assert!(
                expected[..ty.block_len()].iter().all(|v| v.abs() == 0.0),
                "{name}: block 0 has zero scales"
            );
            assert!(n / ty.block_len() >= 6, "{name}: too few blocks");
        }
    }
}

#[test]
fn length_errors_name_the_type() {
    let mut out = vec![0f32; 256];
    let e = dequantize(GgmlType::Q6K, &[0u8; 210], &mut out[..255]).unwrap_err();
    assert!(matches!(e, BlockError::PartialBlock { .. }));
    assert_eq!(
        e.to_string(),
        "Q6_K: 255 elements is not a whole number of 256-element blocks"
    );
    let e = dequantize(GgmlType::Q6K, &[0u8; 211], &mut out).unwrap_err();
    assert_eq!(
        e.to_string(),
        "Q6_K: 256 elements take 210 bytes, but 211 bytes were given"
    );
    assert!(dequantize(GgmlType::F16, &[0u8; 6], &mut out[..3]).is_ok());
}

/// The llama.cpp fixtures' quantized files use only types the vectors cover,
/// and every tensor in them decodes to finite values. (The fixtures' `<Q>.gguf`
/// and `f32.gguf` hold different weights, so they cannot be compared value by
/// value here; the end-to-end check is the forward's, through llama.cpp's
/// `<Q>.dequant.logits.bin`.)
#[test]
fn fixture_types_are_covered_and_decode_finite() {
    let g = vectors();
    let covered: BTreeSet<&str> = ALL_TYPES
        .iter()
        .filter(|t| g.tensor(t.name()).is_some())
        .map(|t| t.name())
        .collect();
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../testdata/llamacpp");
    let mut seen = BTreeSet::new();
    let mut files = 0;
    for fam in std::fs::read_dir(&root).unwrap_or_else(|e| panic!("{}: {e}", root.display())) {
        let fam = fam.unwrap().path();
        if !fam.is_dir() {
            continue;
        }
        for f in std::fs::read_dir(&fam).unwrap() {
            let p = f.unwrap().path();
            let fname = p.file_name().unwrap().to_string_lossy().into_owned();
            if !fname.ends_with(".gguf") || fname == "f32.gguf" {
                continue;
            }
            files += 1;
            let q = Gguf::open(&p).unwrap();
            for t in &q.tensors {
                seen.insert(t.dtype.name());
                assert!(
                    covered.contains(t.dtype.name()),
                    "{}: {} is {}, not in the vectors",
                    p.display(),
                    t.name,
                    t.dtype
                );
                let mut out = vec![0f32; t.n_elements() as usize];
                dequantize(t.dtype, &q.tensor_bytes(t), &mut out)
                    .unwrap_or_else(|e| panic!("{}: {}: {e}", p.display(), t.name));
                assert!(
                    out.iter().all(|v| v.is_finite()),
                    "{}: {} has non-finite values",
                    p.display(),
                    t.name
                );
            }
        }
    }
    assert!(
        files >= 8,
        "expected the eight quantized fixtures, found {files}"
    );
    for ty in ["Q4_K", "Q6_K", "Q8_0", "Q4_0", "Q5_0", "Q5_1", "Q4_1"] {
        assert!(seen.contains(ty), "no fixture uses {ty}: {seen:?}");
    }
}
