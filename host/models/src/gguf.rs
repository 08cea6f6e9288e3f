//! A GGUF (v2/v3) reader: header, metadata, tensor infos and tensor bytes.
//!
//! Layout (little-endian): `"GGUF"`, version u32, tensor count u64, metadata
//! count u64, the metadata key/values, the tensor infos (name, dims, type,
//! offset), padding to `general.alignment` (default 32), then the data.
//! GGUF dims are ggml's `ne`: `ne[0]` is the fastest-moving one, so the
//! row-major (PyTorch) shape is the reverse.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::dequant::{self, GgmlType};

const MAGIC: &[u8; 4] = b"GGUF";
const DEFAULT_ALIGNMENT: u64 = 32;

#[derive(Debug, thiserror::Error)]
pub enum GgufError {
    #[error("cannot read {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("not a GGUF file (magic {0:?})")]
    Magic([u8; 4]),
    #[error("GGUF version {0} is not supported (2 and 3 are)")]
    Version(u32),
    #[error("GGUF truncated at byte {0}")]
    Truncated(usize),
    #[error("GGUF metadata value type {0} is unknown")]
    ValueType(u32),
    #[error("GGUF string is not UTF-8 at byte {0}")]
    Utf8(usize),
    #[error("tensor {name}: {message}")]
    Tensor { name: String, message: String },
    #[error("metadata {key}: {message}")]
    Metadata { key: String, message: String },
}

/// One metadata value. Arrays keep their element values.
#[derive(Debug, Clone, PartialEq)]
pub enum MetaValue {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    String(String),
    Array(Vec<MetaValue>),
    U64(u64),
    I64(i64),
    F64(f64),
}

impl MetaValue {
    /// Any integer type as u64 (negative values are `None`).
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            Self::U8(v) => Some(v.into()),
            Self::U16(v) => Some(v.into()),
            Self::U32(v) => Some(v.into()),
            Self::U64(v) => Some(v),
            Self::I8(v) => u64::try_from(v).ok(),
            Self::I16(v) => u64::try_from(v).ok(),
            Self::I32(v) => u64::try_from(v).ok(),
            Self::I64(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }

    pub fn as_i64(&self) -> Option<i64> {
        match *self {
            Self::I8(v) => Some(v.into()),
            Self::I16(v) => Some(v.into()),
            Self::I32(v) => Some(v.into()),
            Self::I64(v) => Some(v),
            _ => self.as_u64().and_then(|v| i64::try_from(v).ok()),
        }
    }

    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            Self::F32(v) => Some(v.into()),
            Self::F64(v) => Some(v),
            _ => self.as_i64().map(|v| v as f64),
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            Self::String(s) => Some(s),
            _ => None,
        }
    }

    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            Self::Bool(b) => Some(b),
            _ => None,
        }
    }

    pub fn as_array(&self) -> Option<&[MetaValue]> {
        match self {
            Self::Array(items) => Some(items),
            _ => None,
        }
    }
}

/// Where one tensor lives in the file and how it is encoded.
#[derive(Debug, Clone)]
pub struct TensorInfo {
    pub name: String,
    /// ggml order: `dims[0]` is the fastest-moving dimension.
    pub dims: Vec<u64>,
    pub ggml_type: GgmlType,
    /// Offset from the start of the data section.
    pub offset: u64,
}

impl TensorInfo {
    pub fn element_count(&self) -> u64 {
        self.dims.iter().product()
    }

    /// Row-major shape, as PyTorch / safetensors want it.
    pub fn shape(&self) -> Vec<usize> {
        self.dims.iter().rev().map(|&d| d as usize).collect()
    }
}

/// A parsed GGUF file held in memory.
pub struct GgufFile {
    pub version: u32,
    pub metadata: BTreeMap<String, MetaValue>,
    pub tensors: Vec<TensorInfo>,
    bytes: Vec<u8>,
    data_start: usize,
}

impl GgufFile {
    pub fn open(path: &Path) -> Result<Self, GgufError> {
        let bytes = std::fs::read(path).map_err(|source| GgufError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        Self::parse(bytes)
    }

    pub fn parse(bytes: Vec<u8>) -> Result<Self, GgufError> {
        let mut r = Reader {
            bytes: &bytes,
            pos: 0,
        };
        let magic: [u8; 4] = r.take(4)?.try_into().map_err(|_| GgufError::Truncated(0))?;
        if &magic != MAGIC {
            return Err(GgufError::Magic(magic));
        }
        let version = r.u32()?;
        // v1 used 32-bit counts and lengths; nothing current writes it.
        if !(2..=3).contains(&version) {
            return Err(GgufError::Version(version));
        }
        let tensor_count = r.u64()?;
        let kv_count = r.u64()?;
        let mut metadata = BTreeMap::new();
        for _ in 0..kv_count {
            let key = r.string()?;
            let value_type = r.u32()?;
            let value = r.value(value_type)?;
            metadata.insert(key, value);
        }
        let mut tensors = Vec::new();
        for _ in 0..tensor_count {
            let name = r.string()?;
            let n_dims = r.u32()?;
            let dims = (0..n_dims)
                .map(|_| r.u64())
                .collect::<Result<Vec<_>, _>>()?;
            let type_id = r.u32()?;
            let ggml_type = GgmlType::from_id(type_id).ok_or_else(|| GgufError::Tensor {
                name: name.clone(),
                message: format!("ggml type {type_id} is unknown"),
            })?;
            let offset = r.u64()?;
            tensors.push(TensorInfo {
                name,
                dims,
                ggml_type,
                offset,
            });
        }
        let alignment = match metadata.get("general.alignment") {
            None => DEFAULT_ALIGNMENT,
            Some(v) => v
                .as_u64()
                .filter(|a| *a > 0)
                .ok_or_else(|| GgufError::Metadata {
                    key: "general.alignment".into(),
                    message: format!("{v:?} is not a positive integer"),
                })?,
        };
        let data_start = (r.pos as u64).div_ceil(alignment) * alignment;
        let file = Self {
            version,
            metadata,
            tensors,
            data_start: data_start as usize,
            bytes,
        };
        for t in &file.tensors {
            file.tensor_bytes(t)?;
        }
        Ok(file)
    }

    pub fn get(&self, key: &str) -> Option<&MetaValue> {
        self.metadata.get(key)
    }

    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.tensors.iter().find(|t| t.name == name)
    }

    /// The tensor's encoded bytes, exactly as stored.
    pub fn tensor_bytes(&self, t: &TensorInfo) -> Result<&[u8], GgufError> {
        let err = |message: String| GgufError::Tensor {
            name: t.name.clone(),
            message,
        };
        let len = dequant::byte_len(t.ggml_type, t.element_count()).map_err(err)?;
        let start = self.data_start as u64 + t.offset;
        let end = start + len as u64;
        if end > self.bytes.len() as u64 {
            return Err(err(format!(
                "data {start}..{end} runs past the end of the file ({} bytes)",
                self.bytes.len()
            )));
        }
        Ok(&self.bytes[start as usize..end as usize])
    }

    /// The tensor decoded to f32 in row-major order of [`TensorInfo::shape`].
    pub fn dequantize(&self, t: &TensorInfo) -> Result<Vec<f32>, GgufError> {
        let bytes = self.tensor_bytes(t)?;
        dequant::dequantize(t.ggml_type, bytes, t.element_count() as usize).map_err(|message| {
            GgufError::Tensor {
                name: t.name.clone(),
                message,
            }
        })
    }
}

struct Reader<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], GgufError> {
        let end = self
            .pos
            .checked_add(n)
            .filter(|&e| e <= self.bytes.len())
            .ok_or(GgufError::Truncated(self.pos))?;
        let out = &self.bytes[self.pos..end];
        self.pos = end;
        Ok(out)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], GgufError> {
        let at = self.pos;
        self.take(N)?
            .try_into()
            .map_err(|_| GgufError::Truncated(at))
    }

    fn u32(&mut self) -> Result<u32, GgufError> {
        Ok(u32::from_le_bytes(self.array()?))
    }

    fn u64(&mut self) -> Result<u64, GgufError> {
        Ok(u64::from_le_bytes(self.array()?))
    }

    fn string(&mut self) -> Result<String, GgufError> {
        let len = self.u64()?;
        let at = self.pos;
        let len = usize::try_from(len).map_err(|_| GgufError::Truncated(at))?;
        let raw = self.take(len)?;
        String::from_utf8(raw.to_vec()).map_err(|_| GgufError::Utf8(at))
    }

    fn value(&mut self, value_type: u32) -> Result<MetaValue, GgufError> {
        use MetaValue as V;
        Ok(match value_type {
            0 => V::U8(u8::from_le_bytes(self.array()?)),
            1 => V::I8(i8::from_le_bytes(self.array()?)),
            2 => V::U16(u16::from_le_bytes(self.array()?)),
            3 => V::I16(i16::from_le_bytes(self.array()?)),
            4 => V::U32(self.u32()?),
            5 => V::I32(i32::from_le_bytes(self.array()?)),
            6 => V::F32(f32::from_le_bytes(self.array()?)),
            7 => V::Bool(self.array::<1>()?[0] != 0),
            8 => V::String(self.string()?),
            9 => {
                let item_type = self.u32()?;
                let n = self.u64()?;
                // Cap the pre-allocation: a corrupt count must not allocate terabytes.
                let mut items = Vec::with_capacity(n.min(1 << 20) as usize);
                for _ in 0..n {
                    items.push(self.value(item_type)?);
                }
                V::Array(items)
            }
            10 => V::U64(self.u64()?),
            11 => V::I64(i64::from_le_bytes(self.array()?)),
            12 => V::F64(f64::from_le_bytes(self.array()?)),
            other => return Err(GgufError::ValueType(other)),
        })
    }
}
