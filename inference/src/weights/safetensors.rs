//! Tensors of a Hugging Face folder: one `model.safetensors` or a sharded index, read lazily
//! by MLX, floats or MLX-quantized as the folder's configuration says.

use super::{Stacked, TensorSource, WeightFormat};
use crate::config::ModelConfig;
use crate::error::{InferenceError, Result};
use crate::linear::Matrix;
use crate::quantized::QuantizedMatrix;
use crate::weights::FormatOnMlx;
use mlx_rs::{Array, Dtype};
use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// Tensors of a Hugging Face folder (`model.safetensors` or the sharded index). MLX reads
/// safetensors lazily, so tensors that are never asked for are never read.
pub struct SafetensorsSource {
    tensors: HashMap<String, Array>,
    quantization: Option<crate::config::QuantizationConfig>,
    /// Weight files the index names that are not in the folder (a pipeline rank's node holds
    /// only its layers' files): named when a tensor of theirs is asked for.
    absent: Vec<PathBuf>,
}

impl SafetensorsSource {
    /// Opens the safetensors files of a model folder that are there: a node running one
    /// pipeline stage holds only the files of its layers, so the others may be absent (asking
    /// for one of their tensors is an error that names the missing files).
    pub fn open(dir: &Path, config: &ModelConfig) -> Result<SafetensorsSource> {
        let (files, absent): (Vec<PathBuf>, Vec<PathBuf>) = safetensors_files(dir)?
            .into_iter()
            .partition(|f| f.exists());
        let mut tensors = HashMap::new();
        for f in files {
            let loaded = Array::load_safetensors(&f).map_err(|e| InferenceError::BadModel {
                path: f.clone(),
                reason: format!("cannot read safetensors: {e}"),
            })?;
            tensors.extend(
                loaded
                    .into_iter()
                    .map(|(name, t)| (super::text_model_name(&name).into_owned(), t)),
            );
        }
        Ok(SafetensorsSource {
            tensors,
            quantization: config.quantization.clone(),
            absent,
        })
    }

    fn get(&self, name: &str) -> Result<&Array> {
        self.tensors.get(name).ok_or_else(|| {
            if self.absent.is_empty() {
                return InferenceError::MissingTensor(name.to_owned());
            }
            let files: Vec<String> = self
                .absent
                .iter()
                .map(|f| f.display().to_string())
                .collect();
            InferenceError::MissingTensor(format!(
                "{name} (not in this node's weight files; absent here: {})",
                files.join(", ")
            ))
        })
    }
}

/// Bytes of a folder's weights: the sum of its safetensors files when all are there, else
/// the index's `metadata.total_size` (a node holding only some of the files, or only the
/// config and index, still sizes the whole model for placement), else what is there.
pub fn weight_bytes_of_folder(dir: &Path) -> Result<u64> {
    let files = safetensors_files(dir)?;
    let sizes: Vec<Option<u64>> = files
        .iter()
        .map(|f| std::fs::metadata(f).ok().map(|m| m.len()))
        .collect();
    let present: u64 = sizes.iter().flatten().sum();
    if sizes.iter().all(Option::is_some) {
        return Ok(present);
    }
    let total = std::fs::read(dir.join("model.safetensors.index.json"))
        .ok()
        .and_then(|t| serde_json::from_slice::<serde_json::Value>(&t).ok())
        .and_then(|v| v["metadata"]["total_size"].as_u64());
    Ok(total.unwrap_or(present).max(present))
}

/// The safetensors files of a folder: those the index names, else `model.safetensors`.
pub fn safetensors_files(dir: &Path) -> Result<Vec<PathBuf>> {
    let index = dir.join("model.safetensors.index.json");
    if index.exists() {
        let text = std::fs::read_to_string(&index).map_err(|source| InferenceError::Io {
            path: index.clone(),
            source,
        })?;
        let v: serde_json::Value =
            serde_json::from_str(&text).map_err(|e| InferenceError::BadModel {
                path: index.clone(),
                reason: e.to_string(),
            })?;
        let map = v
            .get("weight_map")
            .and_then(|m| m.as_object())
            .ok_or_else(|| InferenceError::BadModel {
                path: index.clone(),
                reason: "no weight_map".into(),
            })?;
        let mut files: Vec<PathBuf> = map
            .values()
            .filter_map(|f| f.as_str())
            .map(|f| dir.join(f))
            .collect();
        files.sort();
        files.dedup();
        return Ok(files);
    }
    let single = dir.join("model.safetensors");
    if single.exists() {
        return Ok(vec![single]);
    }
    Err(InferenceError::BadModel {
        path: dir.to_path_buf(),
        reason: "no model.safetensors or model.safetensors.index.json in the folder".into(),
    })
}

impl TensorSource for SafetensorsSource {
    fn contains(&self, name: &str) -> bool {
        self.tensors.contains_key(name)
    }

    fn dense(&mut self, name: &str, dtype: Dtype) -> Result<Array> {
        let a = self.get(name)?;
        Ok(if a.dtype() == dtype {
            a.clone()
        } else {
            a.as_dtype(dtype)?
        })
    }

    fn matrix(&mut self, prefix: &str, format: WeightFormat) -> Result<Matrix> {
        let name = format!("{prefix}.weight");
        match self.stored_quantized(prefix, format.compute_dtype())? {
            Some(q) if format == WeightFormat::Quantized => Ok(Matrix::Quantized(q)),
            Some(q) => Ok(Matrix::Dense(q.dequantize(format.compute_dtype())?)),
            None => {
                let w = self.get(&name)?.clone();
                if w.ndim() != 2 {
                    return Err(InferenceError::BadTensor {
                        name,
                        reason: format!("expected a matrix, found shape {:?}", w.shape()),
                    });
                }
                Ok(Matrix::Dense(to_dtype(w, format.compute_dtype())?))
            }
        }
    }

    fn stacked(&mut self, prefix: &str, format: WeightFormat) -> Result<Option<Stacked>> {
        let dtype = format.compute_dtype();
        Ok(match self.stored_quantized(prefix, dtype)? {
            Some(q) if format == WeightFormat::Quantized => Some(Stacked::Quantized(q)),
            Some(q) => Some(Stacked::Dense(q.dequantize(dtype)?)),
            None => match self.tensors.get(&format!("{prefix}.weight")) {
                Some(w) => Some(Stacked::Dense(to_dtype(w.clone(), dtype)?)),
                None => None,
            },
        })
    }
}

fn to_dtype(a: Array, dtype: Dtype) -> Result<Array> {
    Ok(if a.dtype() == dtype {
        a
    } else {
        a.as_dtype(dtype)?
    })
}

impl SafetensorsSource {
    /// The quantized weight `prefix` as stored (`.weight`, `.scales`, affine `.biases`), with
    /// its group size, bits and mode from the configuration's entry for that path; `None`
    /// when the tensor is stored as floats.
    fn stored_quantized(&self, prefix: &str, dtype: Dtype) -> Result<Option<QuantizedMatrix>> {
        let scales_name = format!("{prefix}.scales");
        let (Some(q), true) = (&self.quantization, self.tensors.contains_key(&scales_name)) else {
            return Ok(None);
        };
        let spec = q.spec_for(prefix);
        let packed = self.get(&format!("{prefix}.weight"))?.clone();
        let scales = self.get(&scales_name)?;
        let (scales, biases) = if spec.mode.has_biases() {
            (
                scales.as_dtype(dtype)?,
                Some(self.get(&format!("{prefix}.biases"))?.as_dtype(dtype)?),
            )
        } else {
            (scales.clone(), None)
        };
        let matrix = QuantizedMatrix {
            packed,
            scales,
            biases,
            spec,
        };
        let groups = *matrix.scales.shape().last().unwrap_or(&0) as usize;
        if matrix.in_columns() != groups * spec.group_size as usize {
            return Err(InferenceError::BadTensor {
                name: format!("{prefix}.weight"),
                reason: format!(
                    "packed as {} columns at {} bits but its scales have {groups} groups of {}: \
                     the checkpoint's `quantization` entry does not match the tensor",
                    matrix.in_columns(),
                    spec.bits,
                    spec.group_size
                ),
            });
        }
        Ok(Some(matrix))
    }
}
