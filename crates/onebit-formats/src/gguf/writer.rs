//! A small GGUF writer: test fixtures, corruption tests and fuzz seeds are made
//! with it, so the reader is checked against files whose every byte we chose.

use super::Value;
use crate::dtype::GgmlType;

pub struct GgufWriter {
    pub version: u32,
    pub alignment: u64,
    kvs: Vec<(String, Value)>,
    tensors: Vec<(String, Vec<u64>, GgmlType, Vec<u8>)>,
}

impl Default for GgufWriter {
    fn default() -> Self {
        GgufWriter {
            version: 3,
            alignment: 32,
            kvs: Vec::new(),
            tensors: Vec::new(),
        }
    }
}

impl GgufWriter {
    pub fn new() -> Self {
        Self::default()
    }
    /// A copy of an open file: same version, alignment, metadata and tensors,
    /// to edit before writing (tests derive variants of fixtures this way).
    pub fn from_gguf(g: &super::Gguf) -> Self {
        let mut w = GgufWriter {
            version: g.version,
            alignment: g.alignment,
            kvs: g.metadata.clone(),
            tensors: Vec::new(),
        };
        for t in &g.tensors {
            w.tensors.push((
                t.name.clone(),
                t.dims.clone(),
                t.dtype,
                g.tensor_bytes(t).to_vec(),
            ));
        }
        w
    }
    /// Removes a metadata key (no-op when absent).
    pub fn remove_kv(&mut self, key: &str) -> &mut Self {
        self.kvs.retain(|(k, _)| k != key);
        self
    }
    /// Sets a key, replacing an existing value in place.
    pub fn set_kv(&mut self, key: &str, v: Value) -> &mut Self {
        match self.kvs.iter_mut().find(|(k, _)| k == key) {
            Some(slot) => slot.1 = v,
            None => self.kvs.push((key.into(), v)),
        }
        self
    }
    /// Removes a tensor (no-op when absent).
    pub fn remove_tensor(&mut self, name: &str) -> &mut Self {
        self.tensors.retain(|t| t.0 != name);
        self
    }
    /// Replaces a tensor's dims, type and data in place (appends when absent).
    pub fn set_tensor(
        &mut self,
        name: &str,
        dims: &[u64],
        dtype: GgmlType,
        data: Vec<u8>,
    ) -> &mut Self {
        match self.tensors.iter_mut().find(|t| t.0 == name) {
            Some(t) => *t = (name.into(), dims.to_vec(), dtype, data),
            None => self.tensors.push((name.into(), dims.to_vec(), dtype, data)),
        }
        self
    }
    pub fn kv(&mut self, key: &str, v: Value) -> &mut Self {
        self.kvs.push((key.into(), v));
        self
    }
    /// `dims` in ggml order; `data` must already be encoded in `dtype`.
    pub fn tensor(
        &mut self,
        name: &str,
        dims: &[u64],
        dtype: GgmlType,
        data: Vec<u8>,
    ) -> &mut Self {
        self.tensors.push((name.into(), dims.to_vec(), dtype, data));
        self
    }
    pub fn tensor_f32(&mut self, name: &str, dims: &[u64], values: &[f32]) -> &mut Self {
        let data = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        self.tensor(name, dims, GgmlType::F32, data)
    }

    pub fn to_bytes(&self) -> Vec<u8> {
        let mut b = Vec::new();
        b.extend_from_slice(b"GGUF");
        b.extend_from_slice(&self.version.to_le_bytes());
        b.extend_from_slice(&(self.tensors.len() as u64).to_le_bytes());
        b.extend_from_slice(&(self.kvs.len() as u64).to_le_bytes());
        for (k, v) in &self.kvs {
            put_str(&mut b, k);
            b.extend_from_slice(&type_id(v).to_le_bytes());
            put_value(&mut b, v);
        }
        let mut offset = 0u64;
        let mut offsets = Vec::new();
        for (name, dims, dtype, data) in &self.tensors {
            put_str(&mut b, name);
            b.extend_from_slice(&(dims.len() as u32).to_le_bytes());
            for d in dims {
                b.extend_from_slice(&d.to_le_bytes());
            }
            b.extend_from_slice(&dtype.id().to_le_bytes());
            b.extend_from_slice(&offset.to_le_bytes());
            offsets.push(offset);
            offset = (offset + data.len() as u64).div_ceil(self.alignment) * self.alignment;
        }
        let pad = |b: &mut Vec<u8>, a: u64| {
            while !(b.len() as u64).is_multiple_of(a) {
                b.push(0);
            }
        };
        pad(&mut b, self.alignment);
        let start = b.len() as u64;
        for ((_, _, _, data), off) in self.tensors.iter().zip(offsets) {
            b.resize((start + off) as usize, 0);
            b.extend_from_slice(data);
        }
        b
    }
}

fn put_str(b: &mut Vec<u8>, s: &str) {
    b.extend_from_slice(&(s.len() as u64).to_le_bytes());
    b.extend_from_slice(s.as_bytes());
}

fn type_id(v: &Value) -> u32 {
    match v {
        Value::U8(_) => 0,
        Value::I8(_) => 1,
        Value::U16(_) => 2,
        Value::I16(_) => 3,
        Value::U32(_) => 4,
        Value::I32(_) => 5,
        Value::F32(_) => 6,
        Value::Bool(_) => 7,
        Value::Str(_) => 8,
        Value::Array(_) => 9,
        Value::U64(_) => 10,
        Value::I64(_) => 11,
        Value::F64(_) => 12,
    }
}

fn put_value(b: &mut Vec<u8>, v: &Value) {
    match v {
        Value::U8(x) => b.push(*x),
        Value::I8(x) => b.push(*x as u8),
        Value::U16(x) => b.extend_from_slice(&x.to_le_bytes()),
        Value::I16(x) => b.extend_from_slice(&x.to_le_bytes()),
        Value::U32(x) => b.extend_from_slice(&x.to_le_bytes()),
        Value::I32(x) => b.extend_from_slice(&x.to_le_bytes()),
        Value::F32(x) => b.extend_from_slice(&x.to_le_bytes()),
        Value::Bool(x) => b.push(*x as u8),
        Value::Str(s) => put_str(b, s),
        Value::Array(items) => {
            // An empty array is written as an array of u8.
            let elem = items.first().map(type_id).unwrap_or(0);
            b.extend_from_slice(&elem.to_le_bytes());
            b.extend_from_slice(&(items.len() as u64).to_le_bytes());
            for it in items {
                put_value(b, it);
            }
        }
        Value::U64(x) => b.extend_from_slice(&x.to_le_bytes()),
        Value::I64(x) => b.extend_from_slice(&x.to_le_bytes()),
        Value::F64(x) => b.extend_from_slice(&x.to_le_bytes()),
    }
}
