//! Splits a one-file safetensors checkpoint (`model.safetensors`) into several files by
//! layers, with a `model.safetensors.index.json`, as the hub's larger models come: the test
//! hub serves the SmolLM2 fixture this way so that pipeline ranks have files to choose from.

use crate::select::{layer_of, INDEX};
use serde_json::{json, Map, Value};
use std::collections::BTreeMap;
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::Path;

/// Largest safetensors header read.
const MAX_HEADER: u64 = 100 << 20;

fn bad(what: impl Into<String>) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, what.into())
}

/// Writes `src`'s files to `out`, its `model.safetensors` split into `parts` files (layers in
/// contiguous groups, the embedding in the first, other tensors in the last) plus the index.
/// Returns the weight files written.
pub fn split(src: &Path, out: &Path, parts: usize) -> std::io::Result<Vec<String>> {
    let parts = parts.max(1);
    std::fs::create_dir_all(out)?;
    let weights = src.join("model.safetensors");
    let mut f = std::fs::File::open(&weights)?;
    let mut len = [0u8; 8];
    f.read_exact(&mut len)?;
    let n = u64::from_le_bytes(len);
    if n > MAX_HEADER {
        return Err(bad("safetensors header too large"));
    }
    let mut header = vec![0u8; n as usize];
    f.read_exact(&mut header)?;
    let header: Map<String, Value> =
        serde_json::from_slice(&header).map_err(|e| bad(format!("safetensors header: {e}")))?;
    let data_start = 8 + n;
    let tensors: BTreeMap<&String, &Value> = header
        .iter()
        .filter(|(k, _)| *k != "__metadata__")
        .collect();
    let n_layers = tensors
        .keys()
        .filter_map(|k| layer_of(k))
        .max()
        .map_or(1, |m| m + 1);
    let part_of = |name: &str| match layer_of(name) {
        Some(l) => l * parts / n_layers,
        None if name.contains("embed_tokens") => 0,
        None => parts - 1,
    };
    let names: Vec<String> = (0..parts)
        .map(|i| format!("model-{:05}-of-{parts:05}.safetensors", i + 1))
        .collect();
    let mut weight_map = BTreeMap::new();
    let mut total = 0u64;
    for (i, file_name) in names.iter().enumerate() {
        let mine: Vec<(&String, &Value)> = tensors
            .iter()
            .filter(|(k, _)| part_of(k) == i)
            .map(|(k, v)| (*k, *v))
            .collect();
        let mut head = Map::new();
        head.insert("__metadata__".into(), json!({"format": "pt"}));
        let mut offset = 0u64;
        let mut spans = Vec::new();
        for (name, info) in &mine {
            let offs = info["data_offsets"]
                .as_array()
                .ok_or_else(|| bad("no data_offsets"))?;
            let (a, b) = (
                offs.first()
                    .and_then(Value::as_u64)
                    .ok_or_else(|| bad("bad offset"))?,
                offs.get(1)
                    .and_then(Value::as_u64)
                    .ok_or_else(|| bad("bad offset"))?,
            );
            if b < a {
                return Err(bad("bad offsets"));
            }
            let mut entry = (*info).clone();
            entry["data_offsets"] = json!([offset, offset + (b - a)]);
            head.insert((*name).clone(), entry);
            spans.push((a, b));
            offset += b - a;
            weight_map.insert((*name).clone(), file_name.clone());
        }
        total += offset;
        let mut text = serde_json::to_vec(&head).map_err(|e| bad(e.to_string()))?;
        while text.len() % 8 != 0 {
            text.push(b' ');
        }
        let mut w = std::io::BufWriter::new(std::fs::File::create(out.join(file_name))?);
        w.write_all(&(text.len() as u64).to_le_bytes())?;
        w.write_all(&text)?;
        for (a, b) in spans {
            f.seek(SeekFrom::Start(data_start + a))?;
            std::io::copy(&mut (&mut f).take(b - a), &mut w)?;
        }
        w.flush()?;
    }
    let index = json!({"metadata": {"total_size": total}, "weight_map": weight_map});
    std::fs::write(
        out.join(INDEX),
        serde_json::to_vec_pretty(&index).map_err(|e| bad(e.to_string()))?,
    )?;
    for entry in std::fs::read_dir(src)?.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if name != "model.safetensors" && name != INDEX && entry.path().is_file() {
            std::fs::copy(entry.path(), out.join(&name))?;
        }
    }
    Ok(names)
}
