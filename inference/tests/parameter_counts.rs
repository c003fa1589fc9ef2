//! The parameters shoal counts for a configuration equal the ones its checkpoint holds, for
//! every family fixture (`cargo xtask setup` makes them with mlx-lm; the f32 `hf` layouts,
//! whose safetensors headers give each tensor's shape). Those counts size the memory estimate,
//! split a pipeline by bytes and are what `/v1/models` reports, so a family whose layers
//! differ from the shared count (Nemotron-H's one-kind layers of relu² matrices, Gemma 4's
//! KV-shared layers and per-layer inputs) must count its own.

mod common;

use std::collections::BTreeMap;
use std::path::Path;

/// How far a count may be from the checkpoint's: the shared count leaves out small vectors
/// (biases, per-head norms, router biases, attention sinks) some families have, which in these
/// fixtures of width 64 are up to 1.5% of a layer (far less in a released model).
const TOLERANCE: f64 = 0.03;

/// Parameters per tensor name, from the safetensors files of `dir` (the header of each: an
/// 8-byte length, then JSON of `name: {dtype, shape, data_offsets}`): the elements of each
/// tensor, two per byte of gpt-oss's MXFP4 `*_blocks` (E2M1 codes), none for their `*_scales`.
fn tensor_elements(dir: &Path) -> BTreeMap<String, usize> {
    let mut out = BTreeMap::new();
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let path = entry.path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if !name.ends_with(".safetensors") || name == "reference.safetensors" {
            continue;
        }
        let bytes = std::fs::read(&path).unwrap();
        let len = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
        let header: serde_json::Value = serde_json::from_slice(&bytes[8..8 + len]).unwrap();
        for (tensor, info) in header.as_object().unwrap() {
            if tensor == "__metadata__" {
                continue;
            }
            let shape = info["shape"].as_array().unwrap();
            let elements: usize = shape.iter().map(|d| d.as_u64().unwrap() as usize).product();
            let parameters = match info["dtype"].as_str() {
                Some("U8") if tensor.ends_with("_blocks") => 2 * elements,
                Some("U8") if tensor.ends_with("_scales") => 0,
                _ => elements,
            };
            out.insert(tensor.clone(), parameters);
        }
    }
    out
}

/// The layer a tensor belongs to (`...layers.N....`), if any.
fn layer_of(tensor: &str) -> Option<usize> {
    let rest = tensor.split("layers.").nth(1)?;
    rest.split('.').next()?.parse().ok()
}

/// Whether a tensor is outside the language model shoal counts (a vision tower, a
/// multi-token-prediction head).
fn outside_the_text_model(tensor: &str) -> bool {
    ["vision", "visual", "mtp", "multi_modal", "embed_vision"]
        .iter()
        .any(|part| tensor.contains(part))
}

fn within(counted: usize, held: usize) -> bool {
    (counted as f64 - held as f64).abs() <= TOLERANCE * held as f64
}

#[test]
fn every_family_counts_the_parameters_its_checkpoint_holds() {
    let root = kit::dirs::family_fixture_dir("x", "hf");
    let root = root.parent().unwrap().parent().unwrap();
    let mut checked = Vec::new();
    let mut wrong = Vec::new();
    let mut families: Vec<_> = std::fs::read_dir(root)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.join("hf").join("config.json").exists())
        .collect();
    families.sort();
    for family_dir in families {
        let family = family_dir
            .file_name()
            .unwrap()
            .to_string_lossy()
            .into_owned();
        let dir = family_dir.join("hf");
        let config = common::reference::config_of(&dir);
        let tensors: BTreeMap<String, usize> = tensor_elements(&dir)
            .into_iter()
            .filter(|(name, _)| !outside_the_text_model(name))
            .collect();
        let mut per_layer = vec![0usize; config.num_layers];
        for (name, elements) in &tensors {
            if let Some(l) = layer_of(name).filter(|&l| l < config.num_layers) {
                per_layer[l] += elements;
            }
        }
        for (layer, &held) in per_layer.iter().enumerate() {
            let counted = config.parameters_of_layer(layer);
            if !within(counted, held) {
                wrong.push(format!(
                    "{family} layer {layer}: counted {counted}, the checkpoint holds {held}"
                ));
            }
        }
        // Layers beyond num_layers (a multi-token-prediction layer) are not the model's.
        let held: usize = tensors
            .iter()
            .filter(|(name, _)| layer_of(name).is_none_or(|l| l < config.num_layers))
            .map(|(_, e)| e)
            .sum();
        let counted = inference::memory::parameters(&config) as usize;
        if !within(counted, held) {
            wrong.push(format!(
                "{family} in all: counted {counted}, the checkpoint holds {held}"
            ));
        }
        checked.push(family);
    }
    eprintln!("checked {}: {checked:?}", checked.len());
    assert!(checked.len() >= 20, "too few family fixtures: {checked:?}");
    assert!(
        wrong.is_empty(),
        "counts off by more than {TOLERANCE}:\n{}",
        wrong.join("\n")
    );
}
