//! Where weights come from (GGUF files, Hugging Face safetensors folders) and the form they
//! take in memory ([`WeightFormat`]).
//!
//! Sources are asked for tensors by their Hugging Face names (`model.layers.3.mlp.up_proj`),
//! one at a time, so a shard reads only the tensors of its own layers.

use crate::config::ModelConfig;
use crate::error::{InferenceError, Result};
use crate::gguf::{GgmlType, GgufFile};
use crate::linear::{Linear, Matrix};
use crate::quant;
use crate::quantized::{QuantMode, QuantSpec, QuantizedMatrix};
use mlx_rs::{Array, Dtype};

mod safetensors;

/// The name a tensor of a multimodal release's language model has in a text model:
/// `model.language_model.X` (Hugging Face's `*ForConditionalGeneration`) and
/// `language_model.model.X` (mlx-lm's save of it, what mlx-community publishes) are
/// `model.X`, `language_model.lm_head.X` is `lm_head.X`. Other names (the vision tower's
/// among them, which a text model never asks for) stay as they are.
pub fn text_model_name(name: &str) -> std::borrow::Cow<'_, str> {
    for (from, to) in [
        ("model.language_model.", "model."),
        ("language_model.model.", "model."),
        ("language_model.lm_head", "lm_head"),
        // Nemotron-H's backbone, under the names every family's shard reads.
        ("backbone.embeddings.", "model.embed_tokens."),
        ("backbone.norm_f.", "model.norm."),
        ("backbone.", "model."),
    ] {
        if let Some(rest) = name.strip_prefix(from) {
            return format!("{to}{rest}").into();
        }
    }
    name.into()
}

pub use safetensors::{safetensors_files, weight_bytes_of_folder, SafetensorsSource};

pub use wire::weight_format::WeightFormat;

/// What a [`WeightFormat`] means to a model on MLX: the form a model prefers and the one it
/// loads in, and the dtype it computes in. A trait because the format itself is plain data in
/// `wire` (the runner protocol names it), while these read the model and MLX.
pub trait FormatOnMlx: Sized {
    /// The form a model runs in unless memory forbids it, the same on every node (placement
    /// counts it): the backend's default ([`WeightFormat::default_for_backend`]), except that on the
    /// CPU backend a model stored quantized stays quantized when shoal's CPU kernel serves its
    /// encoding ([`crate::cpu_kernels::serves`]: affine 2- to 8-bit, which GGUF files' Q4_0,
    /// Q4_1, Q8_0, Q5_0, Q5_1 and K-quants repack into, see
    /// [`crate::config::QuantizationConfig::of_gguf`]), and a Mixture-of-Experts model stored
    /// quantized stays quantized in any encoding.
    ///
    /// Dense: the quantized form is as fast as f32 and holds a third of the memory
    /// (`cargo xtask bench inference`, SmolLM2-135M at 4 bits, 2026-12-05, medians of 3
    /// interleaved rounds under load: prompt 164.8 against 166.8 tok/s, generation 12.46
    /// against 8.85 tok/s, peak RSS 168 against 575 MB). Mixture of Experts: the f32 form holds
    /// every expert at 8 times the file for the few a token reads (the 1.9 B Qwen3-MoE bench
    /// model at 4 bits holds 9.27 GB as f32 against 1.26 GB), and a cluster of CPU boxes could
    /// not place Qwen3-30B-A3B (17 GB at 4 bits) if placement counted its 122 GB of f32.
    fn preferred(config: &ModelConfig) -> Self;

    /// The form to load layers `range` of a model in when the caller did not choose: the
    /// model's preferred form ([`Self::preferred`]); f32 only if its f32 weights take at most
    /// 60% of the memory available now, otherwise the stored quantization (when the file on
    /// disk, `bytes_on_disk`, is much smaller than f32) or bf16.
    fn choose(config: &ModelConfig, range: &std::ops::Range<usize>, bytes_on_disk: u64) -> Self;

    /// The dtype of activations and dense weights.
    fn compute_dtype(self) -> Dtype;
}

impl FormatOnMlx for WeightFormat {
    fn preferred(config: &ModelConfig) -> WeightFormat {
        let default = Self::default_for_backend();
        if default != WeightFormat::F32 || std::env::var_os(Self::ENV).is_some() {
            return default;
        }
        match &config.quantization {
            Some(q) if config.moe.is_some() || q.specs().all(crate::cpu_kernels::serves) => {
                WeightFormat::Quantized
            }
            _ => default,
        }
    }

    fn choose(
        config: &ModelConfig,
        range: &std::ops::Range<usize>,
        bytes_on_disk: u64,
    ) -> WeightFormat {
        let preferred = Self::preferred(config);
        if preferred != WeightFormat::F32 || std::env::var_os(Self::ENV).is_some() {
            return preferred;
        }
        let embed = (config.vocab_size * config.hidden_size) as u64;
        let f32_bytes = 4 * (config.range_parameters(range) as u64 + 2 * embed);
        let whole_f32 = 4 * (config.all_layer_parameters() as u64 + 2 * embed);
        match available_memory_bytes() {
            Some(avail) if f32_bytes > avail / 10 * 6 => {
                let stored_quantized = bytes_on_disk < whole_f32 / 3;
                let fallback = if stored_quantized {
                    WeightFormat::Quantized
                } else {
                    WeightFormat::Bf16
                };
                tracing::warn!(
                    f32_mb = f32_bytes >> 20,
                    available_mb = avail >> 20,
                    ?fallback,
                    "f32 weights would not fit in memory"
                );
                fallback
            }
            _ => WeightFormat::F32,
        }
    }

    fn compute_dtype(self) -> Dtype {
        match self {
            WeightFormat::F32 => Dtype::Float32,
            WeightFormat::F16 => Dtype::Float16,
            WeightFormat::Bf16 => Dtype::Bfloat16,
            WeightFormat::Quantized if cfg!(target_vendor = "apple") => Dtype::Float16,
            WeightFormat::Quantized => Dtype::Float32,
        }
    }
}

/// Memory available to new allocations (Linux `MemAvailable`), if known.
pub fn available_memory_bytes() -> Option<u64> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = info.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// Something that yields tensors by Hugging Face name.
pub trait TensorSource {
    /// Whether a tensor exists (`name` includes `.weight`/`.bias`).
    fn contains(&self, name: &str) -> bool;
    /// A dense tensor in `dtype` (norm weights, biases).
    fn dense(&mut self, name: &str, dtype: Dtype) -> Result<Array>;
    /// A weight matrix `prefix.weight` in the requested form.
    fn matrix(&mut self, prefix: &str, format: WeightFormat) -> Result<Matrix>;

    /// Experts' weights stacked as `[experts, out, in]` under `prefix.weight` (MLX-community
    /// layout, `switch_mlp.*`), in the requested form; `None` when the source does not hold
    /// them stacked (Hugging Face checkpoints store one matrix per expert).
    fn stacked(&mut self, prefix: &str, format: WeightFormat) -> Result<Option<Stacked>> {
        let _ = (prefix, format);
        Ok(None)
    }

    /// A linear layer: `prefix.weight` and, when present, `prefix.bias`.
    fn linear(&mut self, prefix: &str, format: WeightFormat) -> Result<Linear> {
        let weight = self.matrix(prefix, format)?;
        let bias_name = format!("{prefix}.bias");
        let bias = if self.contains(&bias_name) {
            Some(self.dense(&bias_name, format.compute_dtype())?)
        } else {
            None
        };
        Ok(Linear { weight, bias })
    }
}

/// Experts' weights stacked along a first axis, `[experts, out, in]`.
#[derive(Debug, Clone)]
pub enum Stacked {
    /// Floats.
    Dense(Array),
    /// Quantized (each expert's rows grouped as in a 2-D quantized matrix).
    Quantized(QuantizedMatrix),
}

fn to_i32_shape(shape: &[usize]) -> Vec<i32> {
    shape.iter().map(|&d| d as i32).collect()
}

/// How a model family names its tensors in GGUF files (llama.cpp's names), and which of them
/// GGUF stores differently from Hugging Face.
pub trait GgufNames: Sync {
    /// The GGUF name of a per-layer tensor part (`self_attn.q_proj` → `attn_q`); `None` for
    /// parts this family does not have.
    fn gguf_part(&self, hf_part: &str) -> Option<&'static str>;

    /// Whether GGUF stores this tensor's rows interleaved for GGML's RoPE, so that reading it
    /// must undo that (see [`quant::llama_unpermute_source_row`]).
    fn gguf_rows_interleaved(&self, hf_name: &str) -> bool {
        let _ = hf_name;
        false
    }
}

/// Maps a Hugging Face tensor name to its GGUF name, for a family named by `names`.
pub fn gguf_name(names: &dyn GgufNames, hf: &str) -> Option<String> {
    let (stem, suffix) = hf.rsplit_once('.')?;
    let mapped = match stem {
        "model.embed_tokens" => "token_embd".to_owned(),
        "model.norm" => "output_norm".to_owned(),
        "lm_head" => "output".to_owned(),
        _ => {
            let rest = stem.strip_prefix("model.layers.")?;
            let (layer, part) = rest.split_once('.')?;
            if suffix == "e_score_correction_bias" {
                // llama.cpp's one name for every family's router correction.
                return Some(format!("blk.{layer}.exp_probs_b.bias"));
            }
            match names.gguf_part(part) {
                Some(gguf) => format!("blk.{layer}.{gguf}"),
                // A tensor HF names without a suffix (gpt-oss's `self_attn.sinks`) is the
                // whole part, and llama.cpp's `.weight`.
                None => {
                    let whole = names.gguf_part(&format!("{part}.{suffix}"))?;
                    return Some(format!("blk.{layer}.{whole}.weight"));
                }
            }
        }
    };
    Some(format!("{mapped}.{suffix}"))
}

/// Tensors of a GGUF file, read and converted one at a time.
pub struct GgufSource {
    file: GgufFile,
    names: &'static dyn GgufNames,
    head_dim: usize,
}

impl GgufSource {
    /// Wraps an open GGUF file of a model with this configuration, whose family names its
    /// tensors with `names`.
    pub fn new(file: GgufFile, config: &ModelConfig, names: &'static dyn GgufNames) -> GgufSource {
        GgufSource {
            file,
            names,
            head_dim: config.head_dim,
        }
    }

    /// The underlying file (for metadata).
    pub fn file(&self) -> &GgufFile {
        &self.file
    }

    /// Maps a Hugging Face tensor name to GGUF's (the family names its layers' tensors).
    pub fn gguf_name(&self, hf: &str) -> Option<String> {
        gguf_name(self.names, hf)
    }

    fn lookup(&self, hf: &str) -> Result<String> {
        self.gguf_name(hf)
            .filter(|n| self.file.tensors.contains_key(n))
            .ok_or_else(|| InferenceError::MissingTensor(hf.to_owned()))
    }

    /// Llama GGUFs interleave the rows of Q and K for GGML's RoPE; reading them undoes it.
    fn needs_unpermute(&self, hf: &str) -> bool {
        self.names.gguf_rows_interleaved(hf)
    }
}

impl TensorSource for GgufSource {
    fn contains(&self, name: &str) -> bool {
        self.gguf_name(name)
            .is_some_and(|n| self.file.tensors.contains_key(&n))
    }

    fn dense(&mut self, name: &str, dtype: Dtype) -> Result<Array> {
        let gname = self.lookup(name)?;
        let (info, bytes) = self.file.read_tensor_bytes(&gname)?;
        let ty = info.ggml_type.expect("checked by read_tensor_bytes");
        let mut values = quant::dequantize(ty, &bytes);
        if self.needs_unpermute(name) {
            let row_len = *info.shape.last().unwrap_or(&1);
            let hd = self.head_dim;
            values = quant::gather_rows(&values, row_len, |r| {
                quant::llama_unpermute_source_row(r, hd)
            });
        }
        let array = Array::from_slice(&values, &to_i32_shape(&info.shape));
        Ok(if dtype == Dtype::Float32 {
            array
        } else {
            array.as_dtype(dtype)?
        })
    }

    fn matrix(&mut self, prefix: &str, format: WeightFormat) -> Result<Matrix> {
        let name = format!("{prefix}.weight");
        let gname = self.lookup(&name)?;
        let info = &self.file.tensors[&gname];
        if info.shape.len() != 2 {
            return Err(InferenceError::BadTensor {
                name,
                reason: format!("expected a matrix, found shape {:?}", info.shape),
            });
        }
        if format == WeightFormat::Quantized && info.ggml_type == Ok(GgmlType::Mxfp4) {
            return Ok(Matrix::Quantized(self.mxfp4(&gname)?));
        }
        let stays_quantized = info.ggml_type.is_ok_and(crate::ggml_repack::runs_repacked);
        if format != WeightFormat::Quantized || !stays_quantized {
            return Ok(Matrix::Dense(self.dense(&name, format.compute_dtype())?));
        }
        Ok(Matrix::Quantized(self.repacked(&name, &gname, format)?))
    }

    /// llama.cpp's experts, one tensor per projection (`blk.N.ffn_gate_exps`, GGUF shape
    /// `[experts, out, in]` as this reader lists it): floats as they are, a type the CPU kernel
    /// runs (K-quants, Q8_0, ...) repacked into MLX's affine layout without expanding, so the
    /// gathered product reads the stored bits. `None` where the file has no such tensor.
    fn stacked(&mut self, prefix: &str, format: WeightFormat) -> Result<Option<Stacked>> {
        let name = format!("{prefix}.weight");
        let Some(gname) = self
            .gguf_name(&name)
            .filter(|n| self.file.tensors.contains_key(n))
        else {
            return Ok(None);
        };
        let info = &self.file.tensors[&gname];
        if info.shape.len() != 3 {
            return Err(InferenceError::BadTensor {
                name,
                reason: format!("expected [experts, out, in], found shape {:?}", info.shape),
            });
        }
        if format == WeightFormat::Quantized && info.ggml_type == Ok(GgmlType::Mxfp4) {
            return Ok(Some(Stacked::Quantized(self.mxfp4(&gname)?)));
        }
        let stays_quantized = info.ggml_type.is_ok_and(crate::ggml_repack::runs_repacked);
        if format != WeightFormat::Quantized || !stays_quantized {
            return Ok(Some(Stacked::Dense(
                self.dense(&name, format.compute_dtype())?,
            )));
        }
        Ok(Some(Stacked::Quantized(
            self.repacked(&name, &gname, format)?,
        )))
    }
}

impl GgufSource {
    /// The MXFP4 tensor `gname` in MLX's own `mxfp4` layout (codes moved, not expanded; see
    /// [`crate::ggml_mxfp4`]), every leading axis kept: MLX's quantized and gathered products
    /// read it as the released gpt-oss checkpoint's experts.
    fn mxfp4(&self, gname: &str) -> Result<QuantizedMatrix> {
        let (info, bytes) = self.file.read_tensor_bytes(gname)?;
        let (words, exponents) = crate::ggml_mxfp4::to_mlx(&bytes);
        let mut shape = to_i32_shape(&info.shape);
        let cols = shape.pop().unwrap_or(0);
        let (mut packed, mut scales) = (shape.clone(), shape);
        packed.push(cols / 8);
        scales.push(cols / 32);
        Ok(QuantizedMatrix {
            packed: Array::from_slice(&words, &packed),
            scales: Array::from_slice(&exponents, &scales),
            biases: None,
            spec: QuantSpec {
                group_size: 32,
                bits: 4,
                mode: QuantMode::Mxfp4,
            },
        })
    }

    /// The GGUF tensor `gname` (Hugging Face name `name`, a matrix or experts stacked on a
    /// first axis) repacked into MLX's affine layout: every leading axis kept, the last one
    /// packed. Scales and biases stay f16 where the type stores them so and they are exact.
    fn repacked(&self, name: &str, gname: &str, format: WeightFormat) -> Result<QuantizedMatrix> {
        let (info, bytes) = self.file.read_tensor_bytes(gname)?;
        let ty = info.ggml_type.expect("checked by read_tensor_bytes");
        let mut q = crate::ggml_repack::to_mlx_quantized(ty, &bytes).expect("a quantized type");
        let (lead, cols) = info.shape.split_at(info.shape.len() - 1);
        let (rows, cols) = (lead.iter().product::<usize>(), cols[0]);
        if self.needs_unpermute(name) {
            let hd = self.head_dim;
            let map = |r| quant::llama_unpermute_source_row(r, hd);
            q.packed = quant::gather_rows(&q.packed, q.packed.len() / rows, map);
            q.scales = quant::gather_rows(&q.scales, q.scales.len() / rows, map);
            q.biases = quant::gather_rows(&q.biases, q.biases.len() / rows, map);
        }
        let groups = (cols / q.group_size as usize) as i32;
        let f16_scales = crate::ggml_repack::keeps_f16_scales(ty)
            && crate::ggml_repack::exact_in_f16(&q.scales)
            && crate::ggml_repack::exact_in_f16(&q.biases);
        let dtype = if f16_scales {
            Dtype::Float16
        } else {
            format.compute_dtype()
        };
        let words = (cols * q.bits as usize / 32) as i32;
        let shape = |last: i32| {
            let mut s = to_i32_shape(lead);
            s.push(last);
            s
        };
        Ok(QuantizedMatrix {
            packed: Array::from_slice(&q.packed, &shape(words)),
            scales: Array::from_slice(&q.scales, &shape(groups)).as_dtype(dtype)?,
            biases: Some(Array::from_slice(&q.biases, &shape(groups)).as_dtype(dtype)?),
            spec: QuantSpec {
                group_size: q.group_size,
                bits: q.bits,
                mode: QuantMode::Affine,
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Architecture, RopeScaling};

    fn config(hidden: usize, layers: usize) -> ModelConfig {
        ModelConfig {
            architecture: Architecture::parse("llama").unwrap(),
            hidden_size: hidden,
            num_layers: layers,
            intermediate_size: 4 * hidden,
            num_heads: 8,
            num_kv_heads: 8,
            head_dim: hidden / 8,
            vocab_size: 32000,
            rms_norm_eps: 1e-5,
            rope_theta: 10000.0,
            rope_scaling: RopeScaling::None,
            max_position_embeddings: 4096,
            tie_word_embeddings: false,
            attention_bias: false,
            quantization: None,
            moe: None,
            sliding_window: None,
            family_params: Default::default(),
            attention: Default::default(),
        }
    }

    #[test]
    fn f32_unless_it_does_not_fit() {
        let small = config(64, 2);
        if std::env::var_os(WeightFormat::ENV).is_some() || cfg!(target_vendor = "apple") {
            // The override (or the GPU default) decides, whatever fits.
            let chosen = WeightFormat::default_for_backend();
            assert_eq!(WeightFormat::choose(&small, &(0..2), 1 << 20), chosen);
            assert_eq!(
                WeightFormat::choose(&config(8192, 4000), &(0..4000), 1),
                chosen
            );
            return;
        }
        assert_eq!(
            WeightFormat::choose(&small, &(0..2), 1 << 20),
            WeightFormat::F32
        );
        // 4000 layers of width 8192 is about 13 TB in f32: no machine has that free.
        let huge = config(8192, 4000);
        assert_eq!(
            WeightFormat::choose(&huge, &(0..4000), 1 << 40),
            WeightFormat::Quantized
        );
        assert_eq!(
            WeightFormat::choose(&huge, &(0..4000), 1 << 50),
            WeightFormat::Bf16
        );
        // A Mixture of Experts stored quantized stays quantized; stored as floats it is f32.
        let mut moe = config(64, 2);
        moe.moe = Some(crate::config::MoeConfig {
            num_experts: 8,
            experts_per_token: 2,
            expert_width: 32,
            router: crate::config::RouterKind::TopKSoftmax,
            dense_layers: Vec::new(),
            sparse_step: 1,
            first_dense: 0,
            shared_width: 0,
            latent_width: 0,
        });
        assert_eq!(
            WeightFormat::choose(&moe, &(0..2), 1 << 20),
            WeightFormat::F32
        );
        moe.quantization = Some(crate::config::QuantizationConfig {
            group_size: 64,
            bits: 4,
            mode: QuantMode::Affine,
            overrides: Default::default(),
            running_bytes: None,
        });
        assert_eq!(
            WeightFormat::choose(&moe, &(0..2), 1 << 20),
            WeightFormat::Quantized
        );
        assert_eq!(WeightFormat::preferred(&moe), WeightFormat::Quantized);
        // A dense model stays quantized where shoal's CPU kernel serves every encoding it
        // uses (affine 2, 3, 4, 5, 6 and 8 bits, groups of a multiple of 8: a GGUF file's
        // repacked K-quants use groups of 16), else runs as f32 (MLX's own CPU kernels are
        // slower).
        let quantized = |bits, group, mode, override_bits: Option<i32>| {
            let mut dense = config(64, 2);
            dense.quantization = Some(crate::config::QuantizationConfig {
                group_size: group,
                bits,
                mode,
                overrides: override_bits
                    .map(|b| {
                        let spec = QuantSpec {
                            group_size: 16,
                            bits: b,
                            mode: QuantMode::Affine,
                        };
                        [("gguf:Q6_K".to_string(), spec)].into_iter().collect()
                    })
                    .unwrap_or_default(),
                running_bytes: None,
            });
            WeightFormat::preferred(&dense)
        };
        let q = WeightFormat::Quantized;
        for (bits, group, mode, override_bits, want) in [
            (4, 64, QuantMode::Affine, None, q),
            (8, 64, QuantMode::Affine, Some(4), q),
            (3, 64, QuantMode::Affine, None, q),
            (4, 32, QuantMode::Affine, Some(6), q),
            (5, 32, QuantMode::Affine, Some(6), q),
            (2, 16, QuantMode::Affine, Some(3), q),
            (4, 64, QuantMode::Affine, Some(7), WeightFormat::F32),
            (4, 32, QuantMode::Mxfp4, None, WeightFormat::F32),
        ] {
            assert_eq!(
                quantized(bits, group, mode, override_bits),
                want,
                "{bits} bits, groups of {group}, {mode:?}, override {override_bits:?}"
            );
        }
        assert_eq!(WeightFormat::preferred(&config(64, 2)), WeightFormat::F32);
        assert_eq!("BF16".parse::<WeightFormat>().unwrap(), WeightFormat::Bf16);
        assert!("int3".parse::<WeightFormat>().is_err());
    }
}
