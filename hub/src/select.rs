//! Which of a repository's files a node needs. A whole model: its safetensors weights (or the
//! GGUF file of the quantization asked for) plus the config, tokenizer and template files —
//! never the other formats a repo also carries (`.bin`, `.pth`, ONNX). A pipeline rank with
//! layers `[start, end)`: only the weight files holding those layers' tensors (from
//! `model.safetensors.index.json`'s `weight_map`), the embedding's file on the first rank, the
//! final norm's and head's on the last (with tied embeddings the head *is* the embedding, so
//! the last rank takes that file too). A tensor-parallel rank reads slices of every weight.

use crate::meta::RepoFile;
use serde::Deserialize;
use std::collections::{BTreeMap, BTreeSet};

/// The index of a sharded safetensors checkpoint.
pub const INDEX: &str = "model.safetensors.index.json";
/// Largest index read.
const MAX_INDEX: usize = 64 << 20;

/// The part of a model a node runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shard {
    /// The whole model.
    Whole,
    /// A pipeline stage: layers `start..end` of `n_layers`.
    Layers {
        /// First layer.
        start: usize,
        /// One past the last layer.
        end: usize,
        /// Layers of the model.
        n_layers: usize,
    },
    /// A tensor-parallel rank: slices of every weight.
    Tensor,
}

/// Whether `path` is a configuration, tokenizer or template file (what every rank reads).
pub fn is_support_file(path: &str) -> bool {
    if path.contains('/') {
        return false;
    }
    matches!(path, "tokenizer.model" | "merges.txt")
        || path.ends_with(".json")
        || path.ends_with(".jinja")
}

/// Whether `path` is a safetensors weight file.
pub fn is_safetensors(path: &str) -> bool {
    !path.contains('/') && path.ends_with(".safetensors")
}

/// The GGUF files of quantization `quant` (every part of a split GGUF), by path.
pub fn gguf_files<'a>(files: &'a [RepoFile], quant: &str) -> Vec<&'a RepoFile> {
    let want = quant.to_ascii_lowercase();
    files
        .iter()
        .filter(|f| {
            let p = f.path.to_ascii_lowercase();
            p.ends_with(".gguf")
                && p.rsplit('/')
                    .next()
                    .is_some_and(|name| name.split(['.', '-']).any(|part| part == want))
        })
        .collect()
}

/// The files of a whole model (its `quant` for GGUF repos), or a message saying why none fit.
pub fn for_model(files: &[RepoFile], quant: Option<&str>) -> Result<Vec<RepoFile>, String> {
    let support = files.iter().filter(|f| is_support_file(&f.path));
    let weights: Vec<&RepoFile> = match quant {
        Some(q) => {
            let found = gguf_files(files, q);
            if found.is_empty() {
                let have: BTreeSet<&str> = files
                    .iter()
                    .filter(|f| f.path.ends_with(".gguf"))
                    .map(|f| f.path.as_str())
                    .collect();
                return Err(format!(
                    "the repository has no GGUF file of quantization {q} (it has: {})",
                    if have.is_empty() {
                        "no GGUF files".to_string()
                    } else {
                        have.into_iter().collect::<Vec<_>>().join(", ")
                    }
                ));
            }
            found
        }
        None => files.iter().filter(|f| is_safetensors(&f.path)).collect(),
    };
    if weights.is_empty() {
        return Err(
            "the repository has no safetensors weights at its top level (for a GGUF repo, name the quantization: org/name:Q4_K_M)"
                .into(),
        );
    }
    let mut out: Vec<RepoFile> = support.chain(weights).cloned().collect();
    out.sort();
    out.dedup();
    Ok(out)
}

#[derive(Deserialize)]
struct IndexJson {
    weight_map: BTreeMap<String, String>,
}

/// The layer a tensor belongs to (`model.layers.7.mlp…` → 7), if any.
pub fn layer_of(tensor: &str) -> Option<usize> {
    let rest = tensor.split_once("layers.")?.1;
    rest.split('.').next()?.parse().ok()
}

/// The weight files a shard needs, from an index's JSON text.
pub fn weight_files(index_json: &[u8], shard: Shard) -> Result<BTreeSet<String>, String> {
    if index_json.len() > MAX_INDEX {
        return Err(format!("{INDEX} is larger than {MAX_INDEX} bytes"));
    }
    let index: IndexJson = serde_json::from_slice(index_json)
        .map_err(|e| format!("{INDEX} is not a safetensors index: {e}"))?;
    if let Some(bad) = index.weight_map.values().find(|f| !is_safetensors(f)) {
        return Err(format!(
            "{INDEX} names a file that is not a top-level safetensors file: {bad:.100}"
        ));
    }
    let (start, end, n_layers) = match shard {
        Shard::Whole | Shard::Tensor => return Ok(index.weight_map.into_values().collect()),
        Shard::Layers {
            start,
            end,
            n_layers,
        } => (start, end, n_layers),
    };
    let tied = !index.weight_map.keys().any(|k| k.starts_with("lm_head."));
    let first = start == 0;
    let last = end >= n_layers;
    let mut out = BTreeSet::new();
    for (tensor, file) in &index.weight_map {
        let needed = match layer_of(tensor) {
            Some(layer) => (start..end).contains(&layer),
            None if tensor.contains("embed_tokens")
                || tensor.starts_with("backbone.embeddings") =>
            {
                first || (last && tied)
            }
            None => last,
        };
        if needed {
            out.insert(file.clone());
        }
    }
    Ok(out)
}

/// A shard's files out of a repository's: the support files, and the weight files `index_json`
/// says it needs (every safetensors file when there is no index).
pub fn for_shard(
    files: &[RepoFile],
    index_json: Option<&[u8]>,
    shard: Shard,
) -> Result<Vec<RepoFile>, String> {
    let all = for_model(files, None)?;
    let Some(index) = index_json else {
        return Ok(all);
    };
    let weights = weight_files(index, shard)?;
    if let Some(missing) = weights
        .iter()
        .find(|w| !files.iter().any(|f| &f.path == *w))
    {
        return Err(format!(
            "{INDEX} names {missing}, which the repository does not hold"
        ));
    }
    Ok(all
        .into_iter()
        .filter(|f| !is_safetensors(&f.path) || weights.contains(&f.path))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn file(path: &str) -> RepoFile {
        RepoFile {
            path: path.into(),
            size: 1,
            hash: "aa".into(),
            lfs: false,
        }
    }

    fn index() -> Vec<u8> {
        // Four layers over three files; tied embeddings (no lm_head).
        serde_json::json!({"metadata": {}, "weight_map": {
            "model.embed_tokens.weight": "model-00001-of-00003.safetensors",
            "model.layers.0.self_attn.q_proj.weight": "model-00001-of-00003.safetensors",
            "model.layers.1.mlp.up_proj.weight": "model-00002-of-00003.safetensors",
            "model.layers.2.mlp.up_proj.weight": "model-00002-of-00003.safetensors",
            "model.layers.3.mlp.up_proj.weight": "model-00003-of-00003.safetensors",
            "model.norm.weight": "model-00003-of-00003.safetensors",
        }})
        .to_string()
        .into_bytes()
    }

    fn set(names: &[&str]) -> BTreeSet<String> {
        names
            .iter()
            .map(|n| format!("model-0000{n}-of-00003.safetensors"))
            .collect()
    }

    #[test]
    fn pipeline_ranks_take_their_layers_files() {
        let i = index();
        let s = |start, end| {
            weight_files(
                &i,
                Shard::Layers {
                    start,
                    end,
                    n_layers: 4,
                },
            )
            .unwrap()
        };
        assert_eq!(s(0, 1), set(&["1"]));
        assert_eq!(s(1, 3), set(&["2"]));
        // The last rank: its layer, the norm, and the tied head (the embedding's file).
        assert_eq!(s(3, 4), set(&["1", "3"]));
        assert_eq!(
            weight_files(&i, Shard::Tensor).unwrap(),
            set(&["1", "2", "3"])
        );
    }

    #[test]
    fn an_untied_head_spares_the_last_rank_the_embedding() {
        let mut v: serde_json::Value = serde_json::from_slice(&index()).unwrap();
        v["weight_map"]["lm_head.weight"] = "model-00003-of-00003.safetensors".into();
        let i = v.to_string().into_bytes();
        let last = weight_files(
            &i,
            Shard::Layers {
                start: 3,
                end: 4,
                n_layers: 4,
            },
        )
        .unwrap();
        assert_eq!(last, set(&["3"]));
    }

    #[test]
    fn shards_get_support_files_and_not_other_formats() {
        let files: Vec<RepoFile> = [
            "config.json",
            "tokenizer.json",
            "tokenizer_config.json",
            INDEX,
            "README.md",
            "pytorch_model.bin",
            "onnx/model.onnx",
            "model-00001-of-00003.safetensors",
            "model-00002-of-00003.safetensors",
            "model-00003-of-00003.safetensors",
        ]
        .map(file)
        .to_vec();
        let got = for_shard(
            &files,
            Some(&index()),
            Shard::Layers {
                start: 1,
                end: 3,
                n_layers: 4,
            },
        )
        .unwrap();
        let paths: Vec<&str> = got.iter().map(|f| f.path.as_str()).collect();
        assert_eq!(
            paths,
            [
                "config.json",
                "model-00002-of-00003.safetensors",
                INDEX,
                "tokenizer.json",
                "tokenizer_config.json"
            ]
        );
        let whole = for_model(&files, None).unwrap();
        assert!(!whole
            .iter()
            .any(|f| f.path.ends_with(".bin") || f.path.contains("onnx")));
        assert!(for_model(&files, Some("Q4_K_M"))
            .unwrap_err()
            .contains("no GGUF"));
    }

    #[test]
    fn gguf_quant_picks_its_files() {
        let files = [
            "m.Q4_K_M.gguf",
            "m.Q5_K_M.gguf",
            "m-Q8_0-00001-of-00002.gguf",
            "m-Q8_0-00002-of-00002.gguf",
        ]
        .map(file)
        .to_vec();
        let q = |q| {
            gguf_files(&files, q)
                .iter()
                .map(|f| f.path.clone())
                .collect::<Vec<_>>()
        };
        assert_eq!(q("q4_k_m"), ["m.Q4_K_M.gguf"]);
        assert_eq!(q("Q8_0").len(), 2);
        assert!(q("Q4_K").is_empty());
    }

    proptest! {
        #[test]
        fn index_parsing_never_panics(b in proptest::collection::vec(any::<u8>(), 0..400), s in ".{0,100}") {
            let _ = weight_files(&b, Shard::Layers { start: 0, end: 1, n_layers: 2 });
            let _ = weight_files(s.as_bytes(), Shard::Whole);
            let _ = layer_of(&s);
        }
    }
}
