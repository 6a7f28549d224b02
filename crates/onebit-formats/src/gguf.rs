//! GGUF reader (versions 2 and 3, little-endian).
//!
//! The whole file is memory-mapped; the header, metadata and tensor infos are
//! parsed with a bounds-checked cursor, and every tensor's byte range is checked
//! against the file before any tensor data is touched. Counts read from the file
//! are checked against the bytes left before anything is allocated for them, so
//! a corrupt count cannot ask for gigabytes.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::bytes::ByteView;
use crate::dtype::GgmlType;
use crate::error::{FormatError, Result};

const MAGIC: &[u8; 4] = b"GGUF";
const DEFAULT_ALIGNMENT: u64 = 32;
const MAX_DIMS: u32 = 4;
/// Nesting depth for arrays of arrays; real files use one level.
const MAX_ARRAY_DEPTH: u32 = 4;

/// One metadata value, as typed in the file.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    Str(String),
    Array(Vec<Value>),
    U64(u64),
    I64(i64),
    F64(f64),
}

impl Value {
    pub fn type_name(&self) -> &'static str {
        match self {
            Value::U8(_) => "u8",
            Value::I8(_) => "i8",
            Value::U16(_) => "u16",
            Value::I16(_) => "i16",
            Value::U32(_) => "u32",
            Value::I32(_) => "i32",
            Value::F32(_) => "f32",
            Value::Bool(_) => "bool",
            Value::Str(_) => "string",
            Value::Array(_) => "array",
            Value::U64(_) => "u64",
            Value::I64(_) => "i64",
            Value::F64(_) => "f64",
        }
    }
    /// Any integer type as i64 (u64 values above i64::MAX are not integers we use).
    pub fn as_i64(&self) -> Option<i64> {
        Some(match *self {
            Value::U8(v) => v as i64,
            Value::I8(v) => v as i64,
            Value::U16(v) => v as i64,
            Value::I16(v) => v as i64,
            Value::U32(v) => v as i64,
            Value::I32(v) => v as i64,
            Value::U64(v) => i64::try_from(v).ok()?,
            Value::I64(v) => v,
            _ => return None,
        })
    }
    /// Any numeric type as f64.
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            Value::F32(v) => Some(v as f64),
            Value::F64(v) => Some(v),
            _ => self.as_i64().map(|v| v as f64),
        }
    }
    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            Value::Bool(b) => Some(b),
            _ => None,
        }
    }
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::Str(s) => Some(s),
            _ => None,
        }
    }
    pub fn as_array(&self) -> Option<&[Value]> {
        match self {
            Value::Array(a) => Some(a),
            _ => None,
        }
    }
}

/// Where a tensor is and what it holds. `dims` are in ggml order: `dims[0]` is
/// the contiguous (input) dimension.
#[derive(Clone, Debug)]
pub struct TensorInfo {
    pub name: String,
    pub dims: Vec<u64>,
    pub dtype: GgmlType,
    /// Absolute byte offset in the file.
    pub offset: u64,
    pub n_bytes: u64,
    /// The file of a split GGUF that holds the data: 0 for the file opened,
    /// k for its (k+1)-th part (see [`Gguf::open_all`]).
    pub part: u16,
}

impl TensorInfo {
    pub fn n_elements(&self) -> u64 {
        self.dims.iter().product()
    }
}

/// An open GGUF file.
pub struct Gguf {
    path: PathBuf,
    map: Arc<memmap2::Mmap>,
    /// Whether `map` maps the file (`open`) rather than a copy (`from_bytes`).
    file_backed: bool,
    /// Bytes of the header, metadata and tensor infos (all copied into owned values).
    header_len: usize,
    pub version: u32,
    pub alignment: u64,
    /// Metadata in file order.
    pub metadata: Vec<(String, Value)>,
    meta_index: HashMap<String, usize>,
    pub tensors: Vec<TensorInfo>,
    tensor_index: HashMap<String, usize>,
    /// The other parts of a split GGUF, in order (part 2 first); empty for
    /// a single file.
    parts: Vec<Part>,
}

/// One more file of a split GGUF: where its tensors' bytes are.
struct Part {
    path: PathBuf,
    map: Arc<memmap2::Mmap>,
}

/// The keys llama.cpp's `gguf-split` writes into every part of a split
/// GGUF (`examples/gguf-split`): how many parts, which one this is (from
/// 0), and the tensors of all parts together (in the first part only).
pub const SPLIT_COUNT: &str = "split.count";
pub const SPLIT_NO: &str = "split.no";
pub const SPLIT_TENSORS_COUNT: &str = "split.tensors.count";
/// More parts than this are refused before any is opened.
pub const MAX_SPLIT_PARTS: u64 = 9999;

impl Gguf {
    pub fn open(path: impl AsRef<Path>) -> Result<Gguf> {
        let path = path.as_ref().to_path_buf();
        let map = file_map(&path)?;
        let mut g = Self::parse(path, Arc::new(map))?;
        g.file_backed = true;
        // Everything in the header was copied into `metadata` and `tensors`:
        // drop its pages (megabytes for a large vocabulary) from resident memory.
        ByteView::file_mapped(g.map.clone(), 0, g.header_len).release_pages();
        Ok(g)
    }

    /// Parses a GGUF image held in memory (fuzzing, tests); `path` only
    /// names it in errors. The bytes are copied into an anonymous map.
    pub fn from_bytes(path: impl Into<PathBuf>, bytes: &[u8]) -> Result<Gguf> {
        let path = path.into();
        Self::parse(path.clone(), Arc::new(anon_map(&path, bytes)?))
    }

    fn parse(path: PathBuf, map: Arc<memmap2::Mmap>) -> Result<Gguf> {
        let mut c = Cursor {
            buf: &map[..],
            pos: 0,
            path: &path,
        };
        let magic = c.take(4, "the magic number")?;
        if magic != MAGIC {
            return Err(c.malformed(format!(
                "not a GGUF file (magic {:?}, expected \"GGUF\")",
                String::from_utf8_lossy(magic)
            )));
        }
        let version = c.u32("the version")?;
        if version == 1 {
            return Err(
                c.malformed("GGUF version 1 is not supported (versions 2 and 3 are)".into())
            );
        }
        if !(2..=3).contains(&version) {
            let hint = if version.swap_bytes() <= 3 {
                " (a big-endian file? only little-endian GGUF is supported)"
            } else {
                ""
            };
            return Err(c.malformed(format!(
                "GGUF version {version} is not supported (versions 2 and 3 are){hint}"
            )));
        }
        let n_tensors = c.u64("the tensor count")?;
        let n_kv = c.u64("the metadata count")?;
        // Each kv needs at least a key length (8), a type (4); each tensor info
        // a name length (8), n_dims (4), a type (4), an offset (8).
        c.check_count(n_kv, 12, "metadata count")?;
        c.check_count(n_tensors, 24, "tensor count")?;

        let mut metadata = Vec::with_capacity(n_kv as usize);
        let mut meta_index = HashMap::with_capacity(n_kv as usize);
        for i in 0..n_kv {
            let key = c.string(&format!("the key of metadata entry {i}"))?;
            let ty = c.u32(&format!("the type of `{key}`"))?;
            let value = c.value(ty, &key, 0)?;
            if meta_index.insert(key.clone(), metadata.len()).is_some() {
                return Err(FormatError::Key {
                    path: path.clone(),
                    key,
                    what: "appears twice in the metadata".into(),
                });
            }
            metadata.push((key, value));
        }

        let alignment = match meta_index.get("general.alignment").map(|&i| &metadata[i].1) {
            None => DEFAULT_ALIGNMENT,
            Some(v) => match v.as_i64() {
                Some(a) if a > 0 && (a as u64).is_power_of_two() => a as u64,
                _ => {
                    return Err(FormatError::Key {
                        path: path.clone(),
                        key: "general.alignment".into(),
                        what: format!("must be a power of two, found {v:?}"),
                    })
                }
            },
        };

        let mut raw = Vec::with_capacity(n_tensors as usize);
        for i in 0..n_tensors {
            let name = c.string(&format!("the name of tensor {i}"))?;
            let tensor_err = |what: String| FormatError::Tensor {
                path: path.clone(),
                tensor: name.clone(),
                what,
            };
            let n_dims = c.u32("n_dims")?;
            if n_dims == 0 || n_dims > MAX_DIMS {
                return Err(tensor_err(format!(
                    "has {n_dims} dimensions (1 to {MAX_DIMS} supported)"
                )));
            }
            let mut dims = Vec::with_capacity(n_dims as usize);
            for _ in 0..n_dims {
                dims.push(c.u64("a dimension")?);
            }
            let type_id = c.u32("the type")?;
            let offset = c.u64("the offset")?;
            let dtype = GgmlType::from_id(type_id).ok_or_else(|| {
                tensor_err(match crate::dtype::unread_type_name(type_id) {
                    Some(name) => format!(
                        "has ggml type {name} (id {type_id}), which onebit cannot read \
                         (it reads F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, \
                         Q2_K..Q6_K and MXFP4)"
                    ),
                    None => format!("has ggml type id {type_id}, which onebit cannot read"),
                })
            })?;
            if dims.contains(&0) {
                return Err(tensor_err(format!("has a zero dimension {dims:?}")));
            }
            let n_elements = dims
                .iter()
                .try_fold(1u64, |acc, &d| acc.checked_mul(d))
                .ok_or_else(|| tensor_err(format!("element count overflows: dims {dims:?}")))?;
            if dims[0] % dtype.block_len() as u64 != 0 {
                return Err(tensor_err(format!(
                    "row length {} is not a multiple of the {dtype} block length {}",
                    dims[0],
                    dtype.block_len()
                )));
            }
            let n_bytes = dtype
                .row_bytes(n_elements)
                .ok_or_else(|| tensor_err(format!("byte size overflows: dims {dims:?}")))?;
            if offset % alignment != 0 {
                return Err(tensor_err(format!(
                    "data offset {offset} is not a multiple of the alignment {alignment}"
                )));
            }
            raw.push(TensorInfo {
                name,
                dims,
                dtype,
                offset,
                n_bytes,
                part: 0,
            });
        }

        let header_len = c.pos;
        let data_start = align_up(c.pos as u64, alignment);
        let file_len = map.len() as u64;
        if data_start > file_len && !raw.is_empty() {
            return Err(c.malformed(format!(
                "tensor data would start at byte {data_start}, past the end of the file ({file_len} bytes)"
            )));
        }
        let mut tensor_index = HashMap::with_capacity(raw.len());
        for (i, t) in raw.iter_mut().enumerate() {
            let start = data_start.checked_add(t.offset);
            let end = start.and_then(|s| s.checked_add(t.n_bytes));
            match end {
                Some(end) if end <= file_len => t.offset = start.unwrap(),
                _ => {
                    return Err(FormatError::Tensor {
                        path: path.clone(),
                        tensor: t.name.clone(),
                        what: format!(
                            "data [{} + {}, {} bytes) lies outside the file ({} bytes): truncated or corrupt",
                            data_start, t.offset, t.n_bytes, file_len
                        ),
                    })
                }
            }
            if tensor_index.insert(t.name.clone(), i).is_some() {
                return Err(FormatError::Tensor {
                    path: path.clone(),
                    tensor: t.name.clone(),
                    what: "appears twice in the tensor list".into(),
                });
            }
        }

        Ok(Gguf {
            path,
            map,
            file_backed: false,
            header_len,
            version,
            alignment,
            metadata,
            meta_index,
            tensors: raw,
            tensor_index,
            parts: Vec::new(),
        })
    }

    /// Opens a model file: a single GGUF as [`open`](Self::open) does, or
    /// the first part of a split GGUF (llama.cpp's gguf-split names its
    /// parts `PREFIX-00001-of-0000N.gguf`) with every other part found
    /// beside it, their tensors read as one file's. The metadata is the
    /// first part's. A later part given first, a missing part, or parts
    /// that disagree on the count, their order or the tensor total is
    /// refused by name.
    pub fn open_all(path: impl AsRef<Path>) -> Result<Gguf> {
        let mut g = Self::open(path)?;
        let count = |g: &Gguf, key: &str| -> Result<Option<u64>> {
            match g.get(key) {
                None => Ok(None),
                Some(v) => match v.as_i64() {
                    Some(n) if n >= 0 => Ok(Some(n as u64)),
                    _ => Err(g.key_error(key, format!("must be a count, found {v:?}"))),
                },
            }
        };
        let n = count(&g, SPLIT_COUNT)?.unwrap_or(1);
        if n <= 1 {
            return Ok(g);
        }
        if n > MAX_SPLIT_PARTS {
            return Err(g.key_error(
                SPLIT_COUNT,
                format!("is {n}; at most {MAX_SPLIT_PARTS} parts are read"),
            ));
        }
        let no = count(&g, SPLIT_NO)?.unwrap_or(0);
        let name = g.path.file_name().and_then(|f| f.to_str()).unwrap_or("");
        // gguf-split's names: PREFIX + this suffix, parts counted from 1.
        let suffix = |k: u64| format!("-{k:05}-of-{n:05}.gguf");
        let mine = suffix(no + 1);
        let Some(prefix) = name.strip_suffix(&mine) else {
            return Err(g.key_error(
                SPLIT_COUNT,
                format!(
                    "is {n}: this is part {} of a split GGUF, but its name does not end in `{mine}`, so the other parts cannot be found (gguf-split names them PREFIX{} ...)",
                    no + 1,
                    suffix(1)
                ),
            ));
        };
        let prefix = prefix.to_string();
        if no != 0 {
            return Err(g.key_error(
                SPLIT_NO,
                format!(
                    "is {no}: this is part {} of {n} of a split GGUF; give the first part, {prefix}{}",
                    no + 1,
                    suffix(1)
                ),
            ));
        }
        let dir = g.path.parent().map(Path::to_path_buf).unwrap_or_default();
        for k in 1..n {
            let p = dir.join(format!("{prefix}{}", suffix(k + 1)));
            if !p.is_file() {
                return Err(FormatError::Malformed {
                    path: g.path.clone(),
                    what: format!(
                        "is part 1 of {n} of a split GGUF, but part {} ({}) is not there",
                        k + 1,
                        p.display()
                    ),
                });
            }
            let part = Self::open(&p)?;
            if count(&part, SPLIT_COUNT)? != Some(n) || count(&part, SPLIT_NO)? != Some(k) {
                return Err(part.key_error(
                    SPLIT_NO,
                    format!(
                        "should say part {k} (from 0) of {n} of {}, found {SPLIT_COUNT} {:?} and {SPLIT_NO} {:?}",
                        g.path.display(),
                        part.get(SPLIT_COUNT),
                        part.get(SPLIT_NO)
                    ),
                ));
            }
            let Gguf {
                path, map, tensors, ..
            } = part;
            for mut t in tensors {
                t.part = k as u16;
                if g.tensor_index
                    .insert(t.name.clone(), g.tensors.len())
                    .is_some()
                {
                    return Err(FormatError::Tensor {
                        path,
                        tensor: t.name,
                        what: format!(
                            "is in more than one part of the split GGUF {}",
                            g.path.display()
                        ),
                    });
                }
                g.tensors.push(t);
            }
            g.parts.push(Part { path, map });
        }
        if let Some(total) = count(&g, SPLIT_TENSORS_COUNT)? {
            if total != g.tensors.len() as u64 {
                return Err(g.key_error(
                    SPLIT_TENSORS_COUNT,
                    format!(
                        "is {total}, but the {n} parts hold {} tensors",
                        g.tensors.len()
                    ),
                ));
            }
        }
        Ok(g)
    }

    /// The files of this model: the one opened, then a split GGUF's other
    /// parts in order.
    pub fn files(&self) -> Vec<&Path> {
        std::iter::once(self.path.as_path())
            .chain(self.parts.iter().map(|p| p.path.as_path()))
            .collect()
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn get(&self, key: &str) -> Option<&Value> {
        self.meta_index.get(key).map(|&i| &self.metadata[i].1)
    }

    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.tensor_index.get(name).map(|&i| &self.tensors[i])
    }

    /// The bytes of a tensor; the range was validated at open.
    pub fn tensor_bytes(&self, info: &TensorInfo) -> ByteView {
        let (at, len) = (info.offset as usize, info.n_bytes as usize);
        // Parts are only ever opened from files (`open_all`).
        match info.part.checked_sub(1).map(|k| &self.parts[k as usize]) {
            Some(part) => ByteView::file_mapped(part.map.clone(), at, len),
            None if self.file_backed => ByteView::file_mapped(self.map.clone(), at, len),
            None => ByteView::new(self.map.clone(), at, len),
        }
    }

    /// An error about `key` in this file.
    pub fn key_error(&self, key: &str, what: impl Into<String>) -> FormatError {
        FormatError::Key {
            path: self.path.clone(),
            key: key.into(),
            what: what.into(),
        }
    }

    /// An error about tensor `name` in this file.
    pub fn tensor_error(&self, name: &str, what: impl Into<String>) -> FormatError {
        FormatError::Tensor {
            path: self.path.clone(),
            tensor: name.into(),
            what: what.into(),
        }
    }

    // Typed accessors: each names the key and what was found when it fails.

    pub fn req(&self, key: &str) -> Result<&Value> {
        self.get(key)
            .ok_or_else(|| self.key_error(key, "is required but absent"))
    }
    pub fn u64_opt(&self, key: &str) -> Result<Option<u64>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => match v.as_i64() {
                Some(x) if x >= 0 => Ok(Some(x as u64)),
                _ => Err(self.key_error(
                    key,
                    format!("expected a non-negative integer, found {}", describe(v)),
                )),
            },
        }
    }
    pub fn u64(&self, key: &str) -> Result<u64> {
        self.u64_opt(key)?
            .ok_or_else(|| self.key_error(key, "is required but absent"))
    }
    pub fn f64_opt(&self, key: &str) -> Result<Option<f64>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v.as_f64().map(Some).ok_or_else(|| {
                self.key_error(key, format!("expected a number, found {}", describe(v)))
            }),
        }
    }
    pub fn f64(&self, key: &str) -> Result<f64> {
        self.f64_opt(key)?
            .ok_or_else(|| self.key_error(key, "is required but absent"))
    }
    pub fn bool_opt(&self, key: &str) -> Result<Option<bool>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v.as_bool().map(Some).ok_or_else(|| {
                self.key_error(key, format!("expected a bool, found {}", describe(v)))
            }),
        }
    }
    pub fn str_opt(&self, key: &str) -> Result<Option<&str>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v.as_str().map(Some).ok_or_else(|| {
                self.key_error(key, format!("expected a string, found {}", describe(v)))
            }),
        }
    }
    pub fn str(&self, key: &str) -> Result<&str> {
        self.str_opt(key)?
            .ok_or_else(|| self.key_error(key, "is required but absent"))
    }
    pub fn array_opt(&self, key: &str) -> Result<Option<&[Value]>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v.as_array().map(Some).ok_or_else(|| {
                self.key_error(key, format!("expected an array, found {}", describe(v)))
            }),
        }
    }
}

/// A short description of a value for error messages (arrays by length only).
pub fn describe(v: &Value) -> String {
    match v {
        Value::Array(a) => format!("an array of {} values", a.len()),
        Value::Str(s) if s.len() > 40 => format!("a string of {} bytes", s.len()),
        other => format!("{} {:?}", other.type_name(), other),
    }
}

/// A read-only anonymous map holding a copy of `bytes`.
/// Maps a model file read-only (GGUF and safetensors readers share this).
pub(crate) fn file_map(path: &Path) -> Result<memmap2::Mmap> {
    let io = |source| FormatError::Io {
        path: path.to_path_buf(),
        source,
    };
    let file = std::fs::File::open(path).map_err(io)?;
    // SAFETY: the map is read-only and private to this process; like every
    // mmap-based loader (llama.cpp included) we rely on the file not being
    // truncated or rewritten while it is open. All reads go through
    // bounds-checked slices of the map.
    unsafe { memmap2::Mmap::map(&file) }.map_err(io)
}

pub(crate) fn anon_map(path: &Path, bytes: &[u8]) -> Result<memmap2::Mmap> {
    let io = |source| FormatError::Io {
        path: path.to_path_buf(),
        source,
    };
    // memmap2 accepts a zero length (it maps a page and exposes no bytes).
    let mut m = memmap2::MmapMut::map_anon(bytes.len()).map_err(io)?;
    m.copy_from_slice(bytes);
    m.make_read_only().map_err(io)
}

fn align_up(x: u64, a: u64) -> u64 {
    x.div_ceil(a).saturating_mul(a)
}

struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
    path: &'a Path,
}

impl<'a> Cursor<'a> {
    fn malformed(&self, what: String) -> FormatError {
        FormatError::Malformed {
            path: self.path.to_path_buf(),
            what,
        }
    }
    fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }
    fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8]> {
        if n > self.remaining() {
            return Err(self.malformed(format!(
                "file ends at byte {} while reading {what} ({n} bytes needed at byte {})",
                self.buf.len(),
                self.pos
            )));
        }
        let s = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }
    fn array<const N: usize>(&mut self, what: &str) -> Result<[u8; N]> {
        Ok(self
            .take(N, what)?
            .try_into()
            .expect("take returns N bytes"))
    }
    fn u32(&mut self, what: &str) -> Result<u32> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }
    fn u64(&mut self, what: &str) -> Result<u64> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }
    /// Refuses a count whose items, at `min_bytes` each, cannot fit in what is left.
    fn check_count(&self, n: u64, min_bytes: u64, what: &str) -> Result<()> {
        if n.saturating_mul(min_bytes) > self.remaining() as u64 {
            return Err(self.malformed(format!(
                "{what} {n} at byte {} cannot fit in the {} bytes left: corrupt header",
                self.pos,
                self.remaining()
            )));
        }
        Ok(())
    }
    fn string(&mut self, what: &str) -> Result<String> {
        let n = self.u64(what)?;
        self.check_count(n, 1, &format!("length of {what}"))?;
        let bytes = self.take(n as usize, what)?;
        String::from_utf8(bytes.to_vec())
            .map_err(|_| self.malformed(format!("{what} is not valid UTF-8")))
    }
    fn value(&mut self, ty: u32, key: &str, depth: u32) -> Result<Value> {
        let what = &format!("the value of `{key}`");
        Ok(match ty {
            0 => Value::U8(self.array::<1>(what)?[0]),
            1 => Value::I8(self.array::<1>(what)?[0] as i8),
            2 => Value::U16(u16::from_le_bytes(self.array(what)?)),
            3 => Value::I16(i16::from_le_bytes(self.array(what)?)),
            4 => Value::U32(self.u32(what)?),
            5 => Value::I32(i32::from_le_bytes(self.array(what)?)),
            6 => Value::F32(f32::from_le_bytes(self.array(what)?)),
            7 => match self.array::<1>(what)?[0] {
                0 => Value::Bool(false),
                1 => Value::Bool(true),
                b => {
                    return Err(FormatError::Key {
                        path: self.path.to_path_buf(),
                        key: key.into(),
                        what: format!("bool byte is {b}, expected 0 or 1"),
                    })
                }
            },
            8 => Value::Str(self.string(what)?),
            9 => {
                if depth >= MAX_ARRAY_DEPTH {
                    return Err(self.malformed(format!(
                        "`{key}` nests arrays deeper than {MAX_ARRAY_DEPTH}"
                    )));
                }
                let elem_ty = self.u32(what)?;
                let n = self.u64(what)?;
                let min = match elem_ty {
                    0 | 1 | 7 => 1,
                    2 | 3 => 2,
                    4..=6 => 4,
                    8 | 10..=12 => 8,
                    9 => 12,
                    _ => 1,
                };
                self.check_count(n, min, &format!("element count of `{key}`"))?;
                let mut items = Vec::with_capacity(n as usize);
                for _ in 0..n {
                    items.push(self.value(elem_ty, key, depth + 1)?);
                }
                Value::Array(items)
            }
            10 => Value::U64(self.u64(what)?),
            11 => Value::I64(i64::from_le_bytes(self.array(what)?)),
            12 => Value::F64(f64::from_le_bytes(self.array(what)?)),
            other => {
                return Err(FormatError::Key {
                    path: self.path.to_path_buf(),
                    key: key.into(),
                    what: format!("has unknown value type {other} (0 to 12 exist)"),
                })
            }
        })
    }
}

#[cfg(test)]
mod tests;

pub mod ftype;
pub mod writer;
