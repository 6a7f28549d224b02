//! A bounds-checked safetensors reader and a writer (the container of
//! FastFlowLM's `model.q4nx`).
//!
//! Layout: u64 LE header length, a JSON object (name -> {dtype, shape,
//! data_offsets: [begin, end]}, offsets relative to the end of the header;
//! an optional `__metadata__` map of strings), then the data. Every offset,
//! size and shape is checked at open; errors name the file and the tensor.

use std::collections::{BTreeMap, HashMap};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde_json::Value as Json;

use crate::bytes::ByteView;
use crate::error::{FormatError, Result};

/// Element types a safetensors file may hold that onebit reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum StDtype {
    BF16,
    F16,
    F32,
    I8,
    U8,
}

impl StDtype {
    pub fn name(self) -> &'static str {
        match self {
            StDtype::BF16 => "BF16",
            StDtype::F16 => "F16",
            StDtype::F32 => "F32",
            StDtype::I8 => "I8",
            StDtype::U8 => "U8",
        }
    }
    pub fn from_name(s: &str) -> Option<StDtype> {
        [
            StDtype::BF16,
            StDtype::F16,
            StDtype::F32,
            StDtype::I8,
            StDtype::U8,
        ]
        .into_iter()
        .find(|d| d.name() == s)
    }
    pub fn size(self) -> usize {
        match self {
            StDtype::BF16 | StDtype::F16 => 2,
            StDtype::F32 => 4,
            StDtype::I8 | StDtype::U8 => 1,
        }
    }
}

/// One tensor's entry in the header, its range validated against the file.
#[derive(Clone, Debug)]
pub struct StTensor {
    pub name: String,
    pub dtype: StDtype,
    /// Row-major shape as stored (outermost first).
    pub shape: Vec<u64>,
    /// Absolute byte range in the file.
    pub start: usize,
    pub len: usize,
}

/// An open safetensors file.
pub struct SafeTensors {
    path: PathBuf,
    map: Arc<memmap2::Mmap>,
    /// Tensors in data order.
    pub tensors: Vec<StTensor>,
    index: HashMap<String, usize>,
    pub metadata: BTreeMap<String, String>,
}

/// Headers above this size are refused (real ones are a few hundred KiB).
const MAX_HEADER: u64 = 100 << 20;

impl SafeTensors {
    pub fn open(path: impl AsRef<Path>) -> Result<SafeTensors> {
        let path = path.as_ref().to_path_buf();
        let map = crate::gguf::file_map(&path)?;
        Self::parse(path, Arc::new(map))
    }

    /// Parses a safetensors image held in memory (fuzzing, tests); `path`
    /// only names it in errors.
    pub fn from_bytes(path: impl Into<PathBuf>, bytes: &[u8]) -> Result<SafeTensors> {
        let path = path.into();
        let map = crate::gguf::anon_map(&path, bytes)?;
        Self::parse(path, Arc::new(map))
    }

    fn parse(path: PathBuf, map: Arc<memmap2::Mmap>) -> Result<SafeTensors> {
        let bad = |what: String| FormatError::Malformed {
            path: path.clone(),
            what,
        };
        let total = map.len() as u64;
        if total < 8 {
            return Err(bad(format!(
                "{total} bytes: too short for a safetensors header length"
            )));
        }
        let hlen = u64::from_le_bytes(map[..8].try_into().expect("8 bytes"));
        if hlen > MAX_HEADER || hlen > total - 8 {
            return Err(bad(format!(
                "header length {hlen} exceeds the file ({total} bytes) or the {MAX_HEADER}-byte limit"
            )));
        }
        let data_start = 8 + hlen as usize;
        let header: Json = serde_json::from_slice(&map[8..data_start])
            .map_err(|e| bad(format!("header is not JSON: {e}")))?;
        let obj = header
            .as_object()
            .ok_or_else(|| bad("header is not a JSON object".into()))?;
        let data_len = map.len() - data_start;
        let mut tensors = Vec::with_capacity(obj.len());
        let mut metadata = BTreeMap::new();
        for (name, v) in obj {
            let terr = |what: String| FormatError::Tensor {
                path: path.clone(),
                tensor: name.clone(),
                what,
            };
            if name == "__metadata__" {
                if let Some(m) = v.as_object() {
                    for (k, v) in m {
                        metadata.insert(k.clone(), v.as_str().unwrap_or_default().to_string());
                    }
                }
                continue;
            }
            let dt = v
                .get("dtype")
                .and_then(Json::as_str)
                .ok_or_else(|| terr("has no dtype string".into()))?;
            let dtype = StDtype::from_name(dt).ok_or_else(|| {
                terr(format!(
                    "dtype {dt} is not one onebit reads (BF16, F16, F32, I8, U8)"
                ))
            })?;
            let shape = v
                .get("shape")
                .and_then(Json::as_array)
                .ok_or_else(|| terr("has no shape list".into()))?
                .iter()
                .map(|d| {
                    d.as_u64().ok_or_else(|| {
                        terr(format!("shape entry {d} is not a non-negative integer"))
                    })
                })
                .collect::<Result<Vec<u64>>>()?;
            let offs = v
                .get("data_offsets")
                .and_then(Json::as_array)
                .filter(|a| a.len() == 2)
                .ok_or_else(|| terr("has no [begin, end] data_offsets".into()))?;
            let (b, e) = match (offs[0].as_u64(), offs[1].as_u64()) {
                (Some(b), Some(e)) => (b, e),
                _ => return Err(terr(format!("data_offsets {offs:?} are not integers"))),
            };
            if b > e || e > data_len as u64 {
                return Err(terr(format!(
                    "data_offsets [{b}, {e}] fall outside the {data_len} data bytes"
                )));
            }
            let n = shape
                .iter()
                .try_fold(1u64, |a, &d| a.checked_mul(d))
                .and_then(|n| n.checked_mul(dtype.size() as u64))
                .ok_or_else(|| terr(format!("shape {shape:?} overflows")))?;
            if n != e - b {
                return Err(terr(format!(
                    "shape {shape:?} of {} needs {n} bytes, data_offsets give {}",
                    dtype.name(),
                    e - b
                )));
            }
            tensors.push(StTensor {
                name: name.clone(),
                dtype,
                shape,
                start: data_start + b as usize,
                len: (e - b) as usize,
            });
        }
        tensors.sort_by_key(|t| t.start);
        for w in tensors.windows(2) {
            if w[0].start + w[0].len > w[1].start {
                return Err(FormatError::Tensor {
                    path: path.clone(),
                    tensor: w[1].name.clone(),
                    what: format!("overlaps tensor `{}`", w[0].name),
                });
            }
        }
        let index = tensors
            .iter()
            .enumerate()
            .map(|(i, t)| (t.name.clone(), i))
            .collect();
        Ok(SafeTensors {
            path,
            map,
            tensors,
            index,
            metadata,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn tensor(&self, name: &str) -> Option<&StTensor> {
        self.index.get(name).map(|&i| &self.tensors[i])
    }

    /// The tensor's bytes (range validated at open).
    pub fn bytes(&self, t: &StTensor) -> ByteView {
        ByteView::new(self.map.clone(), t.start, t.len)
    }

    pub fn tensor_error(&self, name: &str, what: impl Into<String>) -> FormatError {
        FormatError::Tensor {
            path: self.path.clone(),
            tensor: name.into(),
            what: what.into(),
        }
    }
}

/// A tensor to write.
pub struct StOut {
    pub name: String,
    pub dtype: StDtype,
    pub shape: Vec<u64>,
    pub data: Vec<u8>,
}

/// Writes a safetensors file: header padded with spaces to 8 bytes, tensors
/// in the given order.
pub fn write(path: &Path, tensors: &[StOut], metadata: &BTreeMap<String, String>) -> Result<()> {
    let io = |source| FormatError::Io {
        path: path.to_path_buf(),
        source,
    };
    let mut header = serde_json::Map::new();
    if !metadata.is_empty() {
        header.insert(
            "__metadata__".into(),
            Json::Object(
                metadata
                    .iter()
                    .map(|(k, v)| (k.clone(), Json::String(v.clone())))
                    .collect(),
            ),
        );
    }
    let mut at = 0u64;
    for t in tensors {
        let n: u64 = t.shape.iter().product::<u64>() * t.dtype.size() as u64;
        if n != t.data.len() as u64 {
            return Err(FormatError::Tensor {
                path: path.to_path_buf(),
                tensor: t.name.clone(),
                what: format!(
                    "shape {:?} needs {n} bytes, {} given to the writer",
                    t.shape,
                    t.data.len()
                ),
            });
        }
        header.insert(
            t.name.clone(),
            serde_json::json!({
                "dtype": t.dtype.name(),
                "shape": t.shape,
                "data_offsets": [at, at + n],
            }),
        );
        at += n;
    }
    let mut h = serde_json::to_vec(&Json::Object(header)).expect("JSON serializes");
    while !h.len().is_multiple_of(8) {
        h.push(b' ');
    }
    let f = std::fs::File::create(path).map_err(io)?;
    let mut w = std::io::BufWriter::new(f);
    w.write_all(&(h.len() as u64).to_le_bytes()).map_err(io)?;
    w.write_all(&h).map_err(io)?;
    for t in tensors {
        w.write_all(&t.data).map_err(io)?;
    }
    w.flush().map_err(io)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tmp(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("onebit-st-{}-{name}", std::process::id()));
        d
    }

    #[test]
    fn round_trip() {
        let p = tmp("rt.safetensors");
        let ts = vec![
            StOut {
                name: "a".into(),
                dtype: StDtype::BF16,
                shape: vec![2, 3],
                data: (0..12).collect(),
            },
            StOut {
                name: "b".into(),
                dtype: StDtype::I8,
                shape: vec![5],
                data: vec![1, 2, 3, 4, 5],
            },
        ];
        write(&p, &ts, &BTreeMap::new()).unwrap();
        let st = SafeTensors::open(&p).unwrap();
        let a = st.tensor("a").unwrap();
        assert_eq!(a.shape, vec![2, 3]);
        assert_eq!(&st.bytes(a)[..], &(0..12).collect::<Vec<u8>>()[..]);
        assert_eq!(&st.bytes(st.tensor("b").unwrap())[..], &[1, 2, 3, 4, 5]);
        std::fs::remove_file(&p).ok();
    }

    fn raw(header: &str, data: usize) -> PathBuf {
        let p = tmp(&format!("bad{}.safetensors", header.len() * 1000 + data));
        let mut v = (header.len() as u64).to_le_bytes().to_vec();
        v.extend_from_slice(header.as_bytes());
        v.extend(std::iter::repeat_n(0u8, data));
        std::fs::write(&p, v).unwrap();
        p
    }

    #[test]
    fn refuses_out_of_range_and_mismatched_tensors() {
        let cases = [
            (
                r#"{"w":{"dtype":"BF16","shape":[4],"data_offsets":[0,16]}}"#,
                8,
                "outside",
            ),
            (
                r#"{"w":{"dtype":"BF16","shape":[4],"data_offsets":[0,6]}}"#,
                8,
                "needs 8 bytes",
            ),
            (
                r#"{"w":{"dtype":"Q9","shape":[4],"data_offsets":[0,8]}}"#,
                8,
                "not one onebit reads",
            ),
            (
                r#"{"w":{"dtype":"I8","shape":[4],"data_offsets":[0,4]},"v":{"dtype":"I8","shape":[4],"data_offsets":[2,6]}}"#,
                8,
                "overlaps",
            ),
        ];
        for (h, n, want) in cases {
            let p = raw(h, n);
            let e = SafeTensors::open(&p).err().expect("refused").to_string();
            assert!(e.contains(want) && e.contains("`"), "{e}");
            std::fs::remove_file(&p).ok();
        }
        // A header length past the end of the file.
        let p = tmp("hlen.safetensors");
        std::fs::write(&p, 1000u64.to_le_bytes()).unwrap();
        assert!(SafeTensors::open(&p)
            .err()
            .unwrap()
            .to_string()
            .contains("header length"));
        std::fs::remove_file(&p).ok();
    }
}
