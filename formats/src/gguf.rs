//! A reader for GGUF files (llama.cpp's model format): metadata, tensor directory, and the
//! raw bytes of single tensors, read on demand so a shard reads only its own layers.
//!
//! Every length and offset read from the file is checked against the file's size, so a
//! truncated or corrupt file gives [`FormatError::BadGguf`], never a panic or a huge
//! allocation.

use crate::error::{FormatError, Result};
use crate::gguf_kquant as kq;
use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufReader, Read};
use std::path::{Path, PathBuf};

/// A metadata value of a GGUF file.
#[derive(Debug, Clone, PartialEq)]
pub enum GgufValue {
    /// Any unsigned integer type.
    Uint(u64),
    /// Any signed integer type.
    Int(i64),
    /// f32 or f64.
    Float(f64),
    /// A boolean.
    Bool(bool),
    /// A UTF-8 string (invalid UTF-8 is replaced).
    String(String),
    /// An array of values.
    Array(Vec<GgufValue>),
}

impl GgufValue {
    /// The value as an unsigned integer, if it is a non-negative integer.
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            GgufValue::Uint(v) => Some(v),
            GgufValue::Int(v) if v >= 0 => Some(v as u64),
            _ => None,
        }
    }
    /// The value as a float, if it is a number.
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            GgufValue::Float(v) => Some(v),
            GgufValue::Uint(v) => Some(v as f64),
            GgufValue::Int(v) => Some(v as f64),
            _ => None,
        }
    }
    /// The value as a string, if it is one.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            GgufValue::String(s) => Some(s),
            _ => None,
        }
    }
    /// The value as a boolean, if it is one.
    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            GgufValue::Bool(b) => Some(b),
            _ => None,
        }
    }
}

/// GGML tensor types this crate reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GgmlType {
    /// 32-bit float.
    F32,
    /// IEEE half.
    F16,
    /// bfloat16.
    Bf16,
    /// 4-bit, blocks of 32: f16 scale `d`, `w = d * (q - 8)`.
    Q4_0,
    /// 4-bit, blocks of 32: f16 scale `d` and minimum `m`, `w = d * q + m`.
    Q4_1,
    /// 5-bit, blocks of 32: f16 scale `d`, `w = d * (q - 16)`.
    Q5_0,
    /// 5-bit, blocks of 32: f16 scale `d` and minimum `m`, `w = d * q + m`.
    Q5_1,
    /// 8-bit, blocks of 32: f16 scale `d`, `w = d * q` with signed `q`.
    Q8_0,
    /// 2-bit K-quant: super-blocks of 256, sub-blocks of 16 with 4-bit scales and minimums.
    Q2K,
    /// 3-bit K-quant: super-blocks of 256, sub-blocks of 16 with 6-bit signed scales.
    Q3K,
    /// 4-bit K-quant: super-blocks of 256, sub-blocks of 32 with 6-bit scales and minimums.
    Q4K,
    /// 5-bit K-quant: as Q4_K with a fifth bit per weight.
    Q5K,
    /// 6-bit K-quant: super-blocks of 256, sub-blocks of 16 with 8-bit signed scales.
    Q6K,
    /// 4-bit non-linear, blocks of 32: f16 scale `d`, `w = d * level[q]` (16 fixed levels);
    /// `llama-quantize`'s fallback for IQ4_XS on rows not a multiple of 256.
    Iq4Nl,
    /// OCP microscaling FP4, blocks of 32: an E8M0 exponent byte `e`, then 16 bytes of E2M1
    /// codes (byte `j`: element `j` low, element `j + 16` high); `w = fp4(q) · 2^(e - 127)`.
    /// gpt-oss's experts, as llama.cpp's converter writes the released checkpoint.
    Mxfp4,
}

impl GgmlType {
    fn from_id(id: u32) -> Option<GgmlType> {
        Some(match id {
            0 => GgmlType::F32,
            1 => GgmlType::F16,
            2 => GgmlType::Q4_0,
            3 => GgmlType::Q4_1,
            6 => GgmlType::Q5_0,
            7 => GgmlType::Q5_1,
            8 => GgmlType::Q8_0,
            10 => GgmlType::Q2K,
            11 => GgmlType::Q3K,
            12 => GgmlType::Q4K,
            13 => GgmlType::Q5K,
            14 => GgmlType::Q6K,
            20 => GgmlType::Iq4Nl,
            30 => GgmlType::Bf16,
            39 => GgmlType::Mxfp4,
            _ => return None,
        })
    }

    /// GGML's id of this type (as stored in GGUF tensor directories).
    pub fn id(self) -> u32 {
        match self {
            GgmlType::F32 => 0,
            GgmlType::F16 => 1,
            GgmlType::Q4_0 => 2,
            GgmlType::Q4_1 => 3,
            GgmlType::Q5_0 => 6,
            GgmlType::Q5_1 => 7,
            GgmlType::Q8_0 => 8,
            GgmlType::Q2K => 10,
            GgmlType::Q3K => 11,
            GgmlType::Q4K => 12,
            GgmlType::Q5K => 13,
            GgmlType::Q6K => 14,
            GgmlType::Iq4Nl => 20,
            GgmlType::Bf16 => 30,
            GgmlType::Mxfp4 => 39,
        }
    }

    /// GGML's name of this type (`Q4_K`).
    pub fn name(self) -> &'static str {
        Self::name_of_id(self.id())
    }

    /// GGML's name of a type id, for errors about types this crate does not read.
    pub fn name_of_id(id: u32) -> &'static str {
        const NAMES: [&str; 40] = [
            "F32",
            "F16",
            "Q4_0",
            "Q4_1",
            "Q4_2",
            "Q4_3",
            "Q5_0",
            "Q5_1",
            "Q8_0",
            "Q8_1",
            "Q2_K",
            "Q3_K",
            "Q4_K",
            "Q5_K",
            "Q6_K",
            "Q8_K",
            "IQ2_XXS",
            "IQ2_XS",
            "IQ3_XXS",
            "IQ1_S",
            "IQ4_NL",
            "IQ3_S",
            "IQ2_S",
            "IQ4_XS",
            "I8",
            "I16",
            "I32",
            "I64",
            "F64",
            "IQ1_M",
            "BF16",
            "Q4_0_4_4",
            "Q4_0_4_8",
            "Q4_0_8_8",
            "TQ1_0",
            "TQ2_0",
            "IQ4_NL_4_4",
            "IQ4_NL_4_8",
            "IQ4_NL_8_8",
            "MXFP4",
        ];
        NAMES.get(id as usize).copied().unwrap_or("unknown")
    }
    /// Elements per block and bytes per block.
    pub fn block(self) -> (usize, usize) {
        match self {
            GgmlType::F32 => (1, 4),
            GgmlType::F16 | GgmlType::Bf16 => (1, 2),
            GgmlType::Q4_0 => (32, 18),
            GgmlType::Q4_1 => (32, 20),
            GgmlType::Q5_0 => (32, kq::Q5_0_BYTES),
            GgmlType::Q5_1 => (32, kq::Q5_1_BYTES),
            GgmlType::Q8_0 => (32, 34),
            GgmlType::Q2K => (kq::QK_K, kq::Q2_K_BYTES),
            GgmlType::Q3K => (kq::QK_K, kq::Q3_K_BYTES),
            GgmlType::Q4K => (kq::QK_K, kq::Q4_K_BYTES),
            GgmlType::Q5K => (kq::QK_K, kq::Q5_K_BYTES),
            GgmlType::Q6K => (kq::QK_K, kq::Q6_K_BYTES),
            GgmlType::Iq4Nl => (32, kq::IQ4_NL_BYTES),
            GgmlType::Mxfp4 => (32, 17),
        }
    }
}

/// Where one tensor lives in the file and how it is stored.
#[derive(Debug, Clone)]
pub struct GgufTensorInfo {
    /// Row-major shape (outermost first; GGUF stores it innermost first).
    pub shape: Vec<usize>,
    /// Storage type; `Err(id)` for a type this crate cannot read.
    pub ggml_type: Result<GgmlType, u32>,
    /// Absolute byte offset of the data in the file.
    pub offset: u64,
    /// Bytes of data.
    pub byte_len: u64,
}

impl GgufTensorInfo {
    /// Number of elements.
    pub fn elements(&self) -> usize {
        self.shape.iter().product()
    }
}

/// An open GGUF file: its metadata and tensor directory, and the file to read tensors from.
#[derive(Debug)]
pub struct GgufFile {
    path: PathBuf,
    file: File,
    /// Metadata key/value pairs.
    pub metadata: BTreeMap<String, GgufValue>,
    /// Tensors by name.
    pub tensors: BTreeMap<String, GgufTensorInfo>,
}

/// Upper bound on any tensor rank, array nesting or string a sane GGUF contains.
const MAX_DIMS: u32 = 8;
const MAX_NESTING: u32 = 4;

struct HeaderReader<R> {
    inner: R,
    pos: u64,
    len: u64,
}

impl<R: Read> HeaderReader<R> {
    fn bytes(&mut self, n: u64) -> std::result::Result<Vec<u8>, String> {
        if n > self.len.saturating_sub(self.pos) {
            return Err(format!(
                "a field of {n} bytes at offset {} runs past the end of the file ({} bytes): the file is truncated or corrupt",
                self.pos, self.len
            ));
        }
        let mut buf = vec![0u8; n as usize];
        self.inner
            .read_exact(&mut buf)
            .map_err(|e| format!("read failed at offset {}: {e}", self.pos))?;
        self.pos += n;
        Ok(buf)
    }
    fn array<const N: usize>(&mut self) -> std::result::Result<[u8; N], String> {
        let v = self.bytes(N as u64)?;
        let mut a = [0u8; N];
        a.copy_from_slice(&v);
        Ok(a)
    }
    fn u32(&mut self) -> std::result::Result<u32, String> {
        Ok(u32::from_le_bytes(self.array()?))
    }
    fn u64(&mut self) -> std::result::Result<u64, String> {
        Ok(u64::from_le_bytes(self.array()?))
    }
    fn string(&mut self) -> std::result::Result<String, String> {
        let n = self.u64()?;
        let b = self.bytes(n)?;
        Ok(String::from_utf8(b)
            .unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned()))
    }
    fn value(&mut self, ty: u32, depth: u32) -> std::result::Result<GgufValue, String> {
        Ok(match ty {
            0 => GgufValue::Uint(self.array::<1>()?[0] as u64),
            1 => GgufValue::Int(self.array::<1>()?[0] as i8 as i64),
            2 => GgufValue::Uint(u16::from_le_bytes(self.array()?) as u64),
            3 => GgufValue::Int(i16::from_le_bytes(self.array()?) as i64),
            4 => GgufValue::Uint(self.u32()? as u64),
            5 => GgufValue::Int(i32::from_le_bytes(self.array()?) as i64),
            6 => GgufValue::Float(f32::from_le_bytes(self.array()?) as f64),
            7 => GgufValue::Bool(self.array::<1>()?[0] != 0),
            8 => GgufValue::String(self.string()?),
            9 => {
                if depth >= MAX_NESTING {
                    return Err("metadata arrays nested too deeply".into());
                }
                let item_ty = self.u32()?;
                let count = self.u64()?;
                // Every item takes at least one byte: a count beyond the rest of the file is corrupt.
                if count > self.len.saturating_sub(self.pos) {
                    return Err(format!(
                        "metadata array of {count} items runs past the end of the file"
                    ));
                }
                let mut items = Vec::with_capacity(count.min(1 << 20) as usize);
                for _ in 0..count {
                    items.push(self.value(item_ty, depth + 1)?);
                }
                GgufValue::Array(items)
            }
            10 => GgufValue::Uint(self.u64()?),
            11 => GgufValue::Int(i64::from_le_bytes(self.array()?)),
            12 => GgufValue::Float(f64::from_le_bytes(self.array()?)),
            other => return Err(format!("unknown metadata value type {other}")),
        })
    }
}

impl GgufFile {
    /// Opens a GGUF file and reads its header, metadata and tensor directory (not the data).
    pub fn open(path: impl AsRef<Path>) -> Result<GgufFile> {
        let path = path.as_ref().to_path_buf();
        let io_err = |source| FormatError::Io {
            path: path.clone(),
            source,
        };
        let file = File::open(&path).map_err(io_err)?;
        let len = file.metadata().map_err(io_err)?.len();
        let bad = |reason: String| FormatError::BadGguf {
            path: path.clone(),
            reason,
        };
        let mut r = HeaderReader {
            inner: BufReader::with_capacity(1 << 20, file.try_clone().map_err(io_err)?),
            pos: 0,
            len,
        };
        let magic = r
            .array::<4>()
            .map_err(|_| bad("the file is shorter than a GGUF header".into()))?;
        if &magic != b"GGUF" {
            return Err(bad("it does not start with the GGUF magic bytes".into()));
        }
        let version = r.u32().map_err(bad)?;
        if !(2..=3).contains(&version) {
            return Err(bad(format!(
                "GGUF version {version} is not supported (2 and 3 are)"
            )));
        }
        let tensor_count = r.u64().map_err(bad)?;
        let kv_count = r.u64().map_err(bad)?;
        if tensor_count > len || kv_count > len {
            return Err(bad("tensor or metadata count larger than the file".into()));
        }
        let mut metadata = BTreeMap::new();
        for _ in 0..kv_count {
            let key = r.string().map_err(bad)?;
            let ty = r.u32().map_err(bad)?;
            let value = r
                .value(ty, 0)
                .map_err(|e| bad(format!("metadata `{key}`: {e}")))?;
            metadata.insert(key, value);
        }
        let alignment = metadata
            .get("general.alignment")
            .and_then(GgufValue::as_u64)
            .unwrap_or(32);
        if alignment == 0 || alignment > 1 << 20 {
            return Err(bad(format!(
                "general.alignment {alignment} is not sensible"
            )));
        }
        let mut raw = Vec::with_capacity(tensor_count.min(1 << 16) as usize);
        for _ in 0..tensor_count {
            let name = r.string().map_err(bad)?;
            let n_dims = r.u32().map_err(bad)?;
            if n_dims == 0 || n_dims > MAX_DIMS {
                return Err(bad(format!("tensor `{name}` has {n_dims} dimensions")));
            }
            let mut dims = Vec::with_capacity(n_dims as usize);
            for _ in 0..n_dims {
                dims.push(r.u64().map_err(bad)?);
            }
            let ty = r.u32().map_err(bad)?;
            let offset = r.u64().map_err(bad)?;
            raw.push((name, dims, ty, offset));
        }
        let data_start = r.pos.div_ceil(alignment) * alignment;
        let mut tensors = BTreeMap::new();
        for (name, dims, ty, offset) in raw {
            let elements = dims.iter().try_fold(1u64, |acc, &d| acc.checked_mul(d));
            let elements = elements
                .filter(|&e| e <= len.saturating_mul(2))
                .ok_or_else(|| bad(format!("tensor `{name}` has an impossible shape {dims:?}")))?;
            let ggml_type = GgmlType::from_id(ty).ok_or(ty);
            let byte_len = match ggml_type {
                Ok(t) => {
                    let (block, bytes) = t.block();
                    if dims[0] % block as u64 != 0 {
                        return Err(bad(format!("tensor `{name}`: row of {} elements is not a whole number of {block}-element blocks", dims[0])));
                    }
                    elements / block as u64 * bytes as u64
                }
                Err(_) => 0,
            };
            let start = data_start
                .checked_add(offset)
                .ok_or_else(|| bad(format!("tensor `{name}` has an impossible offset")))?;
            if start.saturating_add(byte_len) > len {
                return Err(bad(format!(
                    "tensor `{name}` ends at byte {} but the file has only {len} bytes: the file is truncated",
                    start.saturating_add(byte_len)
                )));
            }
            let shape = dims.iter().rev().map(|&d| d as usize).collect();
            tensors.insert(
                name,
                GgufTensorInfo {
                    shape,
                    ggml_type,
                    offset: start,
                    byte_len,
                },
            );
        }
        Ok(GgufFile {
            path,
            file,
            metadata,
            tensors,
        })
    }

    /// The path this file was opened from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// A metadata value.
    pub fn get(&self, key: &str) -> Option<&GgufValue> {
        self.metadata.get(key)
    }

    /// Reads the raw bytes of a tensor.
    pub fn read_tensor_bytes(&self, name: &str) -> Result<(GgufTensorInfo, Vec<u8>)> {
        let info = self
            .tensors
            .get(name)
            .ok_or_else(|| FormatError::MissingTensor(name.to_owned()))?;
        if let Err(id) = info.ggml_type {
            return Err(FormatError::BadTensor {
                name: name.to_owned(),
                reason: format!(
                    "GGML type {id} ({}) is not supported (F32, F16, BF16, Q4_0, Q4_1, Q5_0, \
                     Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL and MXFP4 are)",
                    GgmlType::name_of_id(id)
                ),
            });
        }
        let mut buf = vec![0u8; info.byte_len as usize];
        use std::os::unix::fs::FileExt;
        self.file
            .read_exact_at(&mut buf, info.offset)
            .map_err(|source| FormatError::Io {
                path: self.path.clone(),
                source,
            })?;
        Ok((info.clone(), buf))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn type_ids_and_names_round_trip() {
        for id in 0..64 {
            if let Some(t) = GgmlType::from_id(id) {
                assert_eq!(t.id(), id);
                assert_eq!(t.name(), GgmlType::name_of_id(id));
            }
        }
        assert_eq!(GgmlType::Q4K.name(), "Q4_K");
        assert_eq!(GgmlType::Iq4Nl.name(), "IQ4_NL");
        assert_eq!(GgmlType::from_id(12), Some(GgmlType::Q4K));
        assert_eq!(GgmlType::Q6K.block(), (256, 210));
        assert_eq!(GgmlType::from_id(39), Some(GgmlType::Mxfp4));
        assert_eq!(GgmlType::Mxfp4.name(), "MXFP4");
    }

    #[test]
    fn a_tensor_of_an_unknown_type_is_a_clear_error() {
        // A GGUF v3 file with no metadata and one 256-element tensor of type 16 (IQ2_XXS).
        let mut b = b"GGUF".to_vec();
        b.extend(3u32.to_le_bytes());
        b.extend(1u64.to_le_bytes());
        b.extend(0u64.to_le_bytes());
        b.extend(4u64.to_le_bytes());
        b.extend(b"blob");
        b.extend(1u32.to_le_bytes());
        b.extend(256u64.to_le_bytes());
        b.extend(16u32.to_le_bytes());
        b.extend(0u64.to_le_bytes());
        b.resize(b.len().div_ceil(32) * 32 + 66, 0);
        let path = std::env::temp_dir().join(format!("shoal-iq2-{}.gguf", std::process::id()));
        std::fs::write(&path, &b).unwrap();
        let file = GgufFile::open(&path).unwrap();
        assert_eq!(file.tensors["blob"].ggml_type.as_ref().err(), Some(&16));
        let err = file.read_tensor_bytes("blob").unwrap_err().to_string();
        std::fs::remove_file(&path).ok();
        assert!(
            err.contains("GGML type 16 (IQ2_XXS) is not supported"),
            "{err}"
        );
        assert!(err.contains("Q4_K"), "{err}");
    }
}
