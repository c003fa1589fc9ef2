//! The families shoal runs, keyed as mlx-lm keys them: by the module name a `config.json`'s
//! `model_type` resolves to (through mlx-lm's remapping table, [`MODEL_REMAPPING`]), or a GGUF
//! file's `general.architecture`. Adding a family is its file in [`super`] and one line in
//! [`FAMILIES`]; every list of supported names (errors, `--help`, the README's table check)
//! is read from here.

use super::base::Family;
use super::{
    deepseek_v3, gemma3, glm4_moe, glm4_moe_lite, gpt_oss, llama, minimax, qwen2, qwen3, qwen3_5,
    qwen3_5_moe, qwen3_moe, qwen3_next,
};
use super::{deepseek_v32, glm_moe_dsa, kimi_k3, kimi_linear, mistral4};
use super::{gemma4_text, llama4_text, minimax_m3, nemotron_h, step3p5};
use crate::error::{InferenceError, Result};

/// Every family, under its registry key (mlx-lm's module name).
pub const FAMILIES: &[(&str, &dyn Family)] = &[
    ("llama", &llama::Llama),
    ("qwen2", &qwen2::Qwen2),
    ("qwen3", &qwen3::Qwen3),
    ("qwen3_moe", &qwen3_moe::Qwen3Moe),
    ("gpt_oss", &gpt_oss::GptOss),
    ("gemma3_text", &gemma3::Gemma3),
    ("glm4_moe", &glm4_moe::Glm4Moe),
    ("minimax", &minimax::MiniMax),
    ("deepseek_v3", &deepseek_v3::DeepseekV3),
    ("glm4_moe_lite", &glm4_moe_lite::Glm4MoeLite),
    ("qwen3_5", &qwen3_5::Qwen3_5),
    ("qwen3_5_moe", &qwen3_5_moe::Qwen3_5Moe),
    ("qwen3_next", &qwen3_next::Qwen3Next),
    ("llama4_text", &llama4_text::Llama4Text),
    ("gemma4_text", &gemma4_text::Gemma4Text),
    ("step3p5", &step3p5::Step3p5),
    ("nemotron_h", &nemotron_h::NemotronH),
    ("deepseek_v32", &deepseek_v32::DeepseekV32),
    ("glm_moe_dsa", &glm_moe_dsa::GlmMoeDsa),
    ("mistral4", &mistral4::Mistral4),
    ("kimi_linear", &kimi_linear::KimiLinear),
    ("kimi_k3", &kimi_k3::KimiK3),
    ("minimax_m3_vl", &minimax_m3::MiniMaxM3),
];

/// `model_type`s real checkpoints carry that mlx-lm runs with another module (its
/// `MODEL_REMAPPING` in `mlx_lm/utils.py`), limited to the modules registered here.
pub const MODEL_REMAPPING: &[(&str, &str)] = &[
    ("mistral", "llama"),
    ("iquestcoder", "llama"),
    ("xverse", "llama"),
    ("joyai_llm_flash", "deepseek_v3"),
    ("kimi_k2", "deepseek_v3"),
    ("minimax_m2", "minimax"),
    // Not in mlx-lm's table, but the same load: its `gemma4` module runs `gemma4_text` on a
    // release's `text_config` and `language_model` weights, as shoal reads any such release.
    ("gemma4", "gemma4_text"),
    // mlx-lm's `gemma3` runs `gemma3_text` on the release's `text_config`; the vision tower
    // (`vision_config`) is `gemma3_vision`'s, on rank 0 (issue 47).
    ("gemma3", "gemma3_text"),
];

/// `model_type`s of 2026 releases mlx-lm runs that shoal does not yet, with what is missing:
/// the refusal says so rather than only listing what loads.
pub const NOT_YET: &[(&str, &str)] = &[];

/// llama.cpp's GGUF architecture names (its `llama-arch.cpp`) of families shoal runs from
/// their safetensors releases but whose GGUF tensor layout it does not read yet, with the
/// registry key of that family: a user holding such a GGUF is told the family is supported
/// and which download to take instead, rather than only that the name is unknown.
pub const GGUF_NOT_YET: &[(&str, &str)] = &[
    ("deepseek32", "deepseek_v32"),
    ("gemma3", "gemma3_text"),
    ("gemma4", "gemma4_text"),
    ("glm-dsa", "glm_moe_dsa"),
    ("kimi-k3", "kimi_k3"),
    ("kimi-linear", "kimi_linear"),
    ("llama4", "llama4_text"),
    ("minimax-m2", "minimax"),
    ("minimax-m3", "minimax_m3_vl"),
    ("mistral4", "mistral4"),
    ("nemotron_h", "nemotron_h"),
    ("nemotron_h_moe", "nemotron_h"),
    ("qwen35", "qwen3_5"),
    ("qwen35moe", "qwen3_5_moe"),
    ("qwen3next", "qwen3_next"),
    ("step35", "step3p5"),
];

/// The registry key of a GGUF file's `general.architecture`: only the names a family declares
/// it reads ([`Family::gguf_architectures`]), never a `model_type` of the same spelling (a
/// `gemma3` or `mistral4` GGUF is llama.cpp's layout, not the safetensors one the family
/// reads). A family shoal runs only from safetensors is refused with the download to take.
pub fn resolve_gguf(name: &str) -> Result<&'static str> {
    if let Some((key, _)) = FAMILIES
        .iter()
        .find(|(_, family)| family.gguf_architectures().contains(&name))
    {
        return Ok(key);
    }
    let why = GGUF_NOT_YET
        .iter()
        .find(|(gguf, _)| *gguf == name)
        .map(|(_, key)| {
            format!(
                ": shoal runs this family (`{key}`) from its safetensors release (config.json \
                 and *.safetensors, as mlx-community publishes it, 4-bit or full precision) \
                 but does not read llama.cpp's GGUF layout of it yet; download that release \
                 instead"
            )
        })
        .unwrap_or_default();
    Err(InferenceError::UnsupportedArchitecture {
        name: name.to_owned(),
        why,
        supported: format!(
            "as GGUF, architectures {}; as safetensors, model_types {}",
            supported_gguf_names(),
            supported_names()
        ),
    })
}

/// Every GGUF `general.architecture` shoal reads, sorted and comma-separated.
pub fn supported_gguf_names() -> String {
    let mut names: Vec<&str> = FAMILIES
        .iter()
        .flat_map(|(_, family)| family.gguf_architectures().iter().copied())
        .collect();
    names.sort_unstable();
    names.dedup();
    names.join(", ")
}

/// The registry key of a `model_type` (after mlx-lm's remapping) or GGUF architecture name.
pub fn resolve(name: &str) -> Result<&'static str> {
    let remapped = MODEL_REMAPPING
        .iter()
        .find(|(from, _)| *from == name)
        .map_or(name, |(_, to)| *to);
    if let Some((key, _)) = FAMILIES.iter().find(|(key, _)| *key == remapped) {
        return Ok(key);
    }
    FAMILIES
        .iter()
        .find(|(_, family)| family.gguf_architectures().contains(&name))
        .map(|(key, _)| *key)
        .ok_or_else(|| InferenceError::UnsupportedArchitecture {
            name: name.to_owned(),
            why: NOT_YET
                .iter()
                .find(|(known, _)| *known == name)
                .map(|(_, why)| format!(": {why}"))
                .unwrap_or_default(),
            supported: format!("model_types {}", supported_names()),
        })
}

/// The family registered under `key` (a key [`resolve`] returned).
pub fn by_key(key: &str) -> Option<&'static dyn Family> {
    FAMILIES
        .iter()
        .find(|(k, _)| *k == key)
        .map(|(_, family)| *family)
}

/// Every `model_type` accepted, sorted and comma-separated (registry keys and their aliases),
/// for messages that tell a user what would load.
pub fn supported_names() -> String {
    let mut names: Vec<&str> = FAMILIES
        .iter()
        .map(|(key, _)| *key)
        .chain(MODEL_REMAPPING.iter().map(|(from, _)| *from))
        .collect();
    names.sort_unstable();
    names.dedup();
    names.join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remapped_and_gguf_names_resolve_to_their_family() {
        assert_eq!(resolve("mistral").unwrap(), "llama");
        assert_eq!(resolve("kimi_k2").unwrap(), "deepseek_v3");
        assert_eq!(resolve("minimax_m2").unwrap(), "minimax");
        assert_eq!(resolve("qwen3moe").unwrap(), "qwen3_moe");
        assert_eq!(resolve("gpt-oss").unwrap(), "gpt_oss");
        assert_eq!(resolve("qwen3").unwrap(), "qwen3");
    }

    #[test]
    fn an_unknown_name_lists_every_supported_one() {
        let err = resolve("gpt_neox").unwrap_err().to_string();
        for (key, _) in FAMILIES {
            assert!(err.contains(key), "{key} missing from: {err}");
        }
        assert!(err.contains("minimax_m2"), "{err}");
        assert!(err.contains("`gpt_neox`"), "{err}");
        assert_eq!(resolve("kimi_k3").unwrap(), "kimi_k3");
    }

    #[test]
    fn a_gguf_resolves_only_by_the_names_its_family_reads() {
        assert_eq!(resolve_gguf("qwen3moe").unwrap(), "qwen3_moe");
        assert_eq!(resolve_gguf("deepseek2").unwrap(), "deepseek_v3");
        // `mistral4` is a `model_type` too; as a GGUF it is llama.cpp's layout.
        let err = resolve_gguf("mistral4").unwrap_err().to_string();
        assert!(
            err.contains("`mistral4`") && err.contains("safetensors release"),
            "{err}"
        );
        let err = resolve_gguf("qwen35moe").unwrap_err().to_string();
        assert!(err.contains("(`qwen3_5_moe`)"), "{err}");
        assert!(
            err.contains("as GGUF, architectures deepseek2, glm4moe, gpt-oss, llama"),
            "{err}"
        );
        // An unknown name gets no family's reason, and still every name that loads.
        let err = resolve_gguf("mamba").unwrap_err().to_string();
        assert!(!err.contains("safetensors release"), "{err}");
        assert!(err.contains("qwen3_5_moe"), "{err}");
    }

    #[test]
    fn every_gguf_not_yet_names_a_family_that_does_not_read_it() {
        for (gguf, key) in GGUF_NOT_YET {
            let family = by_key(key).unwrap_or_else(|| panic!("{key} is not registered"));
            assert!(
                !family.gguf_architectures().contains(gguf),
                "{gguf} is read"
            );
        }
    }

    #[test]
    fn keys_are_unique_and_every_export_name_resolves_back() {
        for (i, (key, family)) in FAMILIES.iter().enumerate() {
            assert!(FAMILIES[..i].iter().all(|(k, _)| k != key), "{key} twice");
            let (model_type, class) = family.hf_names();
            assert_eq!(resolve(model_type).unwrap(), *key, "{model_type}");
            assert!(class.ends_with("ForCausalLM"), "{class}");
        }
    }
}
