//! Reading a safetensors file one tensor at a time. The format is an 8-byte
//! little-endian header length, a JSON header naming each tensor's dtype,
//! shape and byte range, then the bytes. `SafeTensors::deserialize` wants
//! the whole file in memory; a load that then made tensors of it all held
//! the model, the file and a copy of the file at once (~3x the weights:
//! 1.9 GB peak RSS for SmolLM2-135M in f32, against transformers' 1.3 GB).
//! Read here, a load holds the model plus one tensor.

use std::collections::HashMap;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use safetensors::tensor::{Dtype, TensorView};
use serde::Deserialize;
use tch::{Device, Kind, Tensor};

use super::ModelError;

/// What safetensors itself refuses: a header over 100 MB.
const MAX_HEADER_BYTES: u64 = 100_000_000;

/// One tensor as the header describes it.
#[derive(Debug)]
pub(crate) struct Entry {
    pub name: String,
    pub kind: Kind,
    pub shape: Vec<i64>,
    /// Byte offset in the file.
    offset: u64,
    bytes: usize,
}

pub(crate) struct WeightFile {
    file: File,
    path: PathBuf,
    entries: Vec<Entry>,
}

#[derive(Deserialize)]
struct HeaderEntry {
    dtype: String,
    shape: Vec<usize>,
    data_offsets: (u64, u64),
}

impl WeightFile {
    /// Opens `path` and checks its header: every tensor's dtype is one agl
    /// loads and its byte range matches its shape and lies in the file.
    pub fn open(path: &Path) -> Result<Self, ModelError> {
        let bad = |why: String| ModelError::Weights(format!("{}: {why}", path.display()));
        let io = |source| ModelError::Io {
            path: path.to_path_buf(),
            source,
        };
        let file = File::open(path).map_err(io)?;
        let file_len = file.metadata().map_err(io)?.len();
        let mut len = [0u8; 8];
        file.read_exact_at(&mut len, 0).map_err(io)?;
        let header_len = u64::from_le_bytes(len);
        if header_len > MAX_HEADER_BYTES || 8 + header_len > file_len {
            return Err(bad(format!(
                "header length {header_len} does not fit the file"
            )));
        }
        let mut header = vec![0u8; header_len as usize];
        file.read_exact_at(&mut header, 8).map_err(io)?;
        let mut raw: serde_json::Map<String, serde_json::Value> =
            serde_json::from_slice(&header).map_err(|e| bad(format!("header: {e}")))?;
        raw.remove("__metadata__");
        let data_start = 8 + header_len;
        let mut entries = Vec::with_capacity(raw.len());
        for (name, value) in raw {
            let e: HeaderEntry = serde_json::from_value(value)
                .map_err(|e| bad(format!("header entry {name}: {e}")))?;
            let kind = match e.dtype.as_str() {
                "F32" => Kind::Float,
                "F16" => Kind::Half,
                "BF16" => Kind::BFloat16,
                other => return Err(bad(format!("{name}: unsupported dtype {other}"))),
            };
            let numel = e
                .shape
                .iter()
                .try_fold(1usize, |n, &d| n.checked_mul(d))
                .ok_or_else(|| bad(format!("{name}: shape {:?} overflows", e.shape)))?;
            let (start, end) = e.data_offsets;
            let bytes = numel.checked_mul(kind.elt_size_in_bytes());
            if end < start || bytes != usize::try_from(end - start).ok() {
                return Err(bad(format!(
                    "{name}: bytes {start}..{end} do not hold shape {:?} of {}",
                    e.shape, e.dtype
                )));
            }
            if data_start
                .checked_add(end)
                .is_none_or(|stop| stop > file_len)
            {
                return Err(bad(format!(
                    "{name}: bytes {start}..{end} run past the file"
                )));
            }
            entries.push(Entry {
                name,
                kind,
                shape: e.shape.iter().map(|&d| d as i64).collect(),
                offset: data_start + start,
                bytes: (end - start) as usize,
            });
        }
        Ok(Self {
            file,
            path: path.to_path_buf(),
            entries,
        })
    }

    pub fn entries(&self) -> &[Entry] {
        &self.entries
    }

    /// The tensor `entry` describes, on the CPU in its stored dtype.
    pub fn read(&self, entry: &Entry) -> Result<Tensor, ModelError> {
        let mut bytes = vec![0u8; entry.bytes];
        self.file
            .read_exact_at(&mut bytes, entry.offset)
            .map_err(|source| ModelError::Io {
                path: self.path.clone(),
                source,
            })?;
        Ok(Tensor::f_from_data_size(&bytes, &entry.shape, entry.kind)?)
    }
}

/// Writes `tensors` as one safetensors file (the metadata transformers
/// checks included).
pub(crate) fn write_tensors(path: &Path, tensors: &[(String, Tensor)]) -> Result<(), ModelError> {
    let mut buffers = Vec::with_capacity(tensors.len());
    for (name, t) in tensors {
        let t = t.to_device(Device::Cpu).contiguous();
        let dtype = match t.kind() {
            Kind::Float => Dtype::F32,
            Kind::Half => Dtype::F16,
            Kind::BFloat16 => Dtype::BF16,
            other => {
                return Err(ModelError::Weights(format!(
                    "{name}: cannot save dtype {other:?}"
                )));
            }
        };
        let mut data = vec![0u8; t.numel() * t.kind().elt_size_in_bytes()];
        t.f_copy_data_u8(&mut data, t.numel())?;
        let shape: Vec<usize> = t.size().iter().map(|&d| d as usize).collect();
        buffers.push((name.as_str(), dtype, shape, data));
    }
    let views = buffers
        .iter()
        .map(|(name, dtype, shape, data)| {
            Ok((*name, TensorView::new(*dtype, shape.clone(), data)?))
        })
        .collect::<Result<Vec<_>, safetensors::SafeTensorError>>()
        .map_err(|source| ModelError::SafeTensors {
            path: path.to_path_buf(),
            source,
        })?;
    // transformers checks this metadata key when loading.
    let metadata = HashMap::from([("format".to_string(), "pt".to_string())]);
    safetensors::tensor::serialize_to_file(views, Some(metadata), path).map_err(|source| {
        ModelError::SafeTensors {
            path: path.to_path_buf(),
            source,
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn saved(dir: &Path) -> PathBuf {
        let path = dir.join("w.safetensors");
        let tensors = vec![
            (
                "a".to_string(),
                Tensor::arange(6, (Kind::Float, tch::Device::Cpu)).view([2, 3]),
            ),
            (
                "b".to_string(),
                Tensor::from_slice(&[1.5f32, -2.0]).to_kind(Kind::BFloat16),
            ),
        ];
        write_tensors(&path, &tensors).unwrap();
        path
    }

    #[test]
    fn reads_back_what_was_written() {
        let dir = tempfile::tempdir().unwrap();
        let file = WeightFile::open(&saved(dir.path())).unwrap();
        let mut names: Vec<_> = file.entries().iter().map(|e| e.name.as_str()).collect();
        names.sort();
        assert_eq!(names, ["a", "b"]);
        for entry in file.entries() {
            let t = file.read(entry).unwrap();
            match entry.name.as_str() {
                "a" => {
                    assert_eq!(t.size(), [2, 3]);
                    assert_eq!(
                        Vec::<f32>::try_from(t.view([-1])).unwrap(),
                        [0., 1., 2., 3., 4., 5.]
                    );
                }
                _ => {
                    assert_eq!(t.kind(), Kind::BFloat16);
                    let v = Vec::<f32>::try_from(t.to_kind(Kind::Float)).unwrap();
                    assert_eq!(v, [1.5, -2.0]);
                }
            }
        }
    }

    #[test]
    fn a_truncated_file_or_a_lying_header_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = saved(dir.path());
        let bytes = std::fs::read(&path).unwrap();
        std::fs::write(&path, &bytes[..bytes.len() - 4]).unwrap();
        let err = WeightFile::open(&path).err().unwrap().to_string();
        assert!(err.contains("run past the file"), "{err}");

        // A header that claims more bytes than the shape holds.
        let mut lying = bytes.clone();
        let at = lying.windows(5).position(|w| w == b"[2,3]").unwrap();
        lying[at + 3] = b'2';
        std::fs::write(&path, &lying).unwrap();
        let err = WeightFile::open(&path).err().unwrap().to_string();
        assert!(err.contains("do not hold shape"), "{err}");

        std::fs::write(&path, [1u8, 2, 3]).unwrap();
        assert!(WeightFile::open(&path).is_err());
    }
}
