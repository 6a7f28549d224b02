use super::writer::GgufWriter;
use super::*;

fn write_tmp(bytes: &[u8]) -> (tempdir::Dir, PathBuf) {
    let dir = tempdir::Dir::new();
    let p = dir.path().join("t.gguf");
    std::fs::write(&p, bytes).unwrap();
    (dir, p)
}

/// A minimal self-cleaning temp dir, to keep dev-dependencies at zero.
mod tempdir {
    use std::path::{Path, PathBuf};
    use std::sync::atomic::{AtomicUsize, Ordering};
    pub struct Dir(PathBuf);
    impl Dir {
        pub fn new() -> Dir {
            static N: AtomicUsize = AtomicUsize::new(0);
            let p = std::env::temp_dir().join(format!(
                "onebit-gguf-test-{}-{}",
                std::process::id(),
                N.fetch_add(1, Ordering::Relaxed)
            ));
            std::fs::create_dir_all(&p).unwrap();
            Dir(p)
        }
        pub fn path(&self) -> &Path {
            &self.0
        }
    }
    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

fn every_value_type() -> Vec<(&'static str, Value)> {
    vec![
        ("u8", Value::U8(200)),
        ("i8", Value::I8(-5)),
        ("u16", Value::U16(65000)),
        ("i16", Value::I16(-30000)),
        ("u32", Value::U32(4_000_000_000)),
        ("i32", Value::I32(-2_000_000_000)),
        ("f32", Value::F32(1.5)),
        ("bool", Value::Bool(true)),
        ("str", Value::Str("héllo".into())),
        ("u64", Value::U64(1 << 40)),
        ("i64", Value::I64(-(1 << 40))),
        ("f64", Value::F64(-2.25)),
        (
            "strs",
            Value::Array(vec![
                Value::Str("a".into()),
                Value::Str("".into()),
                Value::Str("<s>".into()),
            ]),
        ),
        ("ints", Value::Array(vec![Value::I32(1), Value::I32(-2)])),
        (
            "nested",
            Value::Array(vec![
                Value::Array(vec![Value::U8(1)]),
                Value::Array(vec![Value::U8(2), Value::U8(3)]),
            ]),
        ),
    ]
}

#[test]
fn reads_every_value_type_in_v2_and_v3() {
    for version in [2, 3] {
        let mut w = GgufWriter::new();
        w.version = version;
        for (k, v) in every_value_type() {
            w.kv(k, v);
        }
        w.tensor_f32("t", &[2, 3], &[1., 2., 3., 4., 5., 6.]);
        let (_d, p) = write_tmp(&w.to_bytes());
        let g = Gguf::open(&p).unwrap();
        assert_eq!(g.version, version);
        for (k, v) in every_value_type() {
            assert_eq!(g.get(k), Some(&v), "key {k}");
        }
        let t = g.tensor("t").unwrap();
        assert_eq!(t.dims, vec![2, 3]);
        let bytes = g.tensor_bytes(t);
        let vals: Vec<f32> = bytes
            .chunks(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect();
        assert_eq!(vals, vec![1., 2., 3., 4., 5., 6.]);
    }
}

#[test]
fn honours_general_alignment() {
    let mut w = GgufWriter::new();
    w.alignment = 64;
    w.kv("general.alignment", Value::U32(64));
    w.tensor_f32("a", &[3], &[1., 2., 3.]);
    w.tensor_f32("b", &[1], &[7.]);
    let bytes = w.to_bytes();
    let (_d, p) = write_tmp(&bytes);
    let g = Gguf::open(&p).unwrap();
    assert_eq!(g.alignment, 64);
    let b = g.tensor("b").unwrap();
    assert_eq!(b.offset % 64, 0);
    assert_eq!(&g.tensor_bytes(b)[..], &7f32.to_le_bytes());
}

#[test]
fn refuses_bad_alignment_value() {
    let mut w = GgufWriter::new();
    w.kv("general.alignment", Value::U32(48));
    let (_d, p) = write_tmp(&w.to_bytes());
    let e = Gguf::open(&p).err().unwrap().to_string();
    assert!(
        e.contains("general.alignment") && e.contains("power of two"),
        "{e}"
    );
}

#[test]
fn refuses_tensor_outside_file_naming_it() {
    let mut w = GgufWriter::new();
    w.tensor_f32("blk.0.attn_q.weight", &[4, 4], &[0.5; 16]);
    let mut bytes = w.to_bytes();
    bytes.truncate(bytes.len() - 8);
    let (_d, p) = write_tmp(&bytes);
    let e = Gguf::open(&p).err().unwrap().to_string();
    assert!(
        e.contains("blk.0.attn_q.weight") && e.contains("outside the file"),
        "{e}"
    );
}

#[test]
fn refuses_huge_counts_before_allocating() {
    let mut w = GgufWriter::new();
    w.kv("x", Value::U8(1));
    let mut bytes = w.to_bytes();
    // metadata count lives at bytes 16..24
    bytes[16..24].copy_from_slice(&(u64::MAX / 2).to_le_bytes());
    let (_d, p) = write_tmp(&bytes);
    let e = Gguf::open(&p).err().unwrap().to_string();
    assert!(e.contains("metadata count"), "{e}");
}

#[test]
fn refuses_unknown_dtype_and_version_and_magic() {
    let mut w = GgufWriter::new();
    w.tensor("w", &[32], GgmlType::Q4_0, vec![0; 18]);
    let mut bytes = w.to_bytes();
    // type id follows name (8 + 1), n_dims (4), dims (8): patch it to 99
    let pos = 24 + 8 + 1 + 4 + 8;
    bytes[pos..pos + 4].copy_from_slice(&99u32.to_le_bytes());
    let (_d, p) = write_tmp(&bytes);
    let e = Gguf::open(&p).err().unwrap().to_string();
    assert!(e.contains("`w`") && e.contains("type id 99"), "{e}");

    let mut bytes = w.to_bytes();
    bytes[4..8].copy_from_slice(&1u32.to_le_bytes());
    let (_d, p) = write_tmp(&bytes);
    assert!(Gguf::open(&p)
        .err()
        .unwrap()
        .to_string()
        .contains("version 1"));

    let (_d, p) = write_tmp(b"GGML\x03\0\0\0");
    assert!(Gguf::open(&p)
        .err()
        .unwrap()
        .to_string()
        .contains("not a GGUF file"));
}

/// Every ggml type onebit does not read (the i-quants IQ1_S..IQ4_XS that
/// MoE files carry, the ternary and integer types) is refused when the
/// file is opened, naming the file, the tensor and the type, never a panic.
#[test]
fn refuses_every_unread_type_by_name() {
    for (id, name) in crate::dtype::UNREAD_TYPES {
        let mut w = GgufWriter::new();
        w.tensor(
            "blk.0.ffn_down_exps.weight",
            &[256],
            GgmlType::Q4_0,
            vec![0; 144],
        );
        let mut bytes = w.to_bytes();
        // The type id follows the name (8 + 26), n_dims (4) and dims (8).
        let pos = 24 + 8 + 26 + 4 + 8;
        assert_eq!(bytes[pos..pos + 4], GgmlType::Q4_0.id().to_le_bytes());
        bytes[pos..pos + 4].copy_from_slice(&id.to_le_bytes());
        let (_d, p) = write_tmp(&bytes);
        let e = Gguf::open(&p).err().unwrap().to_string();
        let file = p.display().to_string();
        assert!(
            e.contains(&file)
                && e.contains("`blk.0.ffn_down_exps.weight`")
                && e.contains(&format!("ggml type {name} (id {id})")),
            "{e}"
        );
    }
}

#[test]
fn refuses_row_not_multiple_of_block() {
    let mut w = GgufWriter::new();
    w.tensor("w", &[48], GgmlType::Q4_0, vec![0; 36]);
    let (_d, p) = write_tmp(&w.to_bytes());
    let e = Gguf::open(&p).err().unwrap().to_string();
    assert!(
        e.contains("not a multiple of the Q4_0 block length 32"),
        "{e}"
    );
}

#[test]
fn every_truncation_is_an_error_not_a_panic() {
    let mut w = GgufWriter::new();
    for (k, v) in every_value_type() {
        w.kv(k, v);
    }
    w.tensor_f32("t", &[8], &[1.0; 8]);
    let bytes = w.to_bytes();
    let dir = tempdir::Dir::new();
    for cut in 0..bytes.len() {
        let p = dir.path().join("cut.gguf");
        std::fs::write(&p, &bytes[..cut]).unwrap();
        assert!(
            Gguf::open(&p).is_err(),
            "truncated at {cut} of {} opened",
            bytes.len()
        );
    }
}
