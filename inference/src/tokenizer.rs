//! Tokenizer and chat template: from a Hugging Face folder (`tokenizer.json`,
//! `tokenizer_config.json`) or rebuilt from the vocabulary, merges and template that a GGUF
//! file carries in its metadata.

use crate::error::{InferenceError, Result};
use crate::gguf::{GgufFile, GgufValue};
use serde_json::{json, Value};
use std::path::Path;
use std::str::FromStr;

/// Llama 3's pre-tokenizer split (GGUF `tokenizer.ggml.pre = llama-bpe`).
const LLAMA3_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// Qwen2's pre-tokenizer split (GGUF `tokenizer.ggml.pre = qwen2`).
const QWEN2_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// A tokenizer with the model's special tokens and chat template.
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    /// Beginning-of-sequence token, if the model has one.
    pub bos_token_id: Option<u32>,
    /// Tokens that end generation.
    pub eos_token_ids: Vec<u32>,
    /// Whether plain (non-chat) prompts start with the BOS token.
    pub add_bos: bool,
    /// The chat template (Jinja source), if the model has one.
    pub chat_template: Option<String>,
}

/// One message of a chat.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ChatMessage {
    /// `system`, `user`, `assistant` or `tool`.
    pub role: String,
    /// The text.
    pub content: String,
}

impl ChatMessage {
    /// A message with this role and content.
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> ChatMessage {
        ChatMessage {
            role: role.into(),
            content: content.into(),
        }
    }
}

fn strings(file: &GgufFile, key: &str) -> Option<Vec<String>> {
    match file.get(key)? {
        GgufValue::Array(items) => items
            .iter()
            .map(|v| v.as_str().map(str::to_owned))
            .collect(),
        _ => None,
    }
}

fn tok_err(e: impl std::fmt::Display) -> InferenceError {
    InferenceError::Tokenizer(e.to_string())
}

impl Tokenizer {
    /// Rebuilds the tokenizer from GGUF metadata (byte-level BPE models only).
    pub fn from_gguf(file: &GgufFile) -> Result<Tokenizer> {
        let model = file
            .get("tokenizer.ggml.model")
            .and_then(GgufValue::as_str)
            .unwrap_or("");
        if model != "gpt2" {
            return Err(InferenceError::Tokenizer(format!(
                "GGUF tokenizer model `{model}` is not supported (byte-level BPE, `gpt2`, is)"
            )));
        }
        let tokens = strings(file, "tokenizer.ggml.tokens")
            .ok_or_else(|| tok_err("GGUF has no tokenizer.ggml.tokens"))?;
        let merges = strings(file, "tokenizer.ggml.merges")
            .ok_or_else(|| tok_err("GGUF has no tokenizer.ggml.merges"))?;
        let types: Vec<i64> = match file.get("tokenizer.ggml.token_type") {
            Some(GgufValue::Array(a)) => {
                a.iter().map(|v| v.as_f64().unwrap_or(1.0) as i64).collect()
            }
            _ => vec![1; tokens.len()],
        };
        let pre = file
            .get("tokenizer.ggml.pre")
            .and_then(GgufValue::as_str)
            .unwrap_or("default");
        let mut vocab = serde_json::Map::new();
        let mut added = Vec::new();
        for (id, tok) in tokens.iter().enumerate() {
            vocab.insert(tok.clone(), json!(id));
            let ty = types.get(id).copied().unwrap_or(1);
            if ty == 3 || ty == 4 {
                added.push(json!({
                    "id": id, "content": tok, "single_word": false, "lstrip": false,
                    "rstrip": false, "normalized": false, "special": ty == 3,
                }));
            }
        }
        let byte_level = |use_regex: bool| json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": use_regex});
        let split = |pattern: &str| json!({"type": "Split", "pattern": {"Regex": pattern}, "behavior": "Isolated", "invert": false});
        let (normalizer, pre_tokenizer) = match pre {
            "smollm" | "starcoder" | "refact" => (
                Value::Null,
                json!({"type": "Sequence", "pretokenizers": [{"type": "Digits", "individual_digits": true}, byte_level(true)]}),
            ),
            "llama-bpe" | "llama3" | "smaug-bpe" => (
                Value::Null,
                json!({"type": "Sequence", "pretokenizers": [split(LLAMA3_SPLIT), byte_level(false)]}),
            ),
            "qwen2" | "deepseek-r1-qwen" => (
                json!({"type": "NFC"}),
                json!({"type": "Sequence", "pretokenizers": [split(QWEN2_SPLIT), byte_level(false)]}),
            ),
            _ => {
                tracing::warn!(
                    pre,
                    "unknown GGUF pre-tokenizer; using GPT-2's byte-level split"
                );
                (Value::Null, byte_level(true))
            }
        };
        let spec = json!({
            "version": "1.0",
            "truncation": null,
            "padding": null,
            "added_tokens": added,
            "normalizer": normalizer,
            "pre_tokenizer": pre_tokenizer,
            "post_processor": null,
            "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
            "model": {
                "type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
                "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
                "vocab": vocab, "merges": merges,
            },
        });
        let inner = tokenizers::Tokenizer::from_str(&spec.to_string()).map_err(tok_err)?;
        let id = |k: &str| file.get(k).and_then(GgufValue::as_u64).map(|v| v as u32);
        let bos_token_id = id("tokenizer.ggml.bos_token_id");
        let mut eos_token_ids: Vec<u32> = id("tokenizer.ggml.eos_token_id")
            .into_iter()
            .chain(id("tokenizer.ggml.eot_token_id"))
            .collect();
        // Chat models end a turn with their end-of-turn token even when EOS is another one.
        for end in ["<|im_end|>", "<|eot_id|>", "<|endoftext|>", "<|end|>"] {
            if let Some(i) = tokens.iter().position(|t| t == end) {
                if types.get(i) == Some(&3) {
                    eos_token_ids.push(i as u32);
                }
            }
        }
        eos_token_ids.sort_unstable();
        eos_token_ids.dedup();
        Ok(Tokenizer {
            inner,
            bos_token_id,
            eos_token_ids,
            add_bos: file
                .get("tokenizer.ggml.add_bos_token")
                .and_then(GgufValue::as_bool)
                .unwrap_or(false),
            chat_template: file
                .get("tokenizer.chat_template")
                .and_then(GgufValue::as_str)
                .map(str::to_owned),
        })
    }

    /// Loads `tokenizer.json` and `tokenizer_config.json` (and `chat_template.jinja` if
    /// present) from a Hugging Face folder; `config` is the model's config.json.
    pub fn from_hf_dir(dir: &Path, config: &Value) -> Result<Tokenizer> {
        let path = dir.join("tokenizer.json");
        let inner = tokenizers::Tokenizer::from_file(&path)
            .map_err(|e| tok_err(format!("{}: {e}", path.display())))?;
        let tc: Value = std::fs::read_to_string(dir.join("tokenizer_config.json"))
            .ok()
            .and_then(|s| serde_json::from_str(&s).ok())
            .unwrap_or(Value::Null);
        let token_text = |v: Option<&Value>| -> Option<String> {
            match v? {
                Value::String(s) => Some(s.clone()),
                Value::Object(o) => o.get("content").and_then(Value::as_str).map(str::to_owned),
                _ => None,
            }
        };
        let bos = token_text(tc.get("bos_token"));
        let bos_token_id = bos
            .as_deref()
            .and_then(|t| inner.token_to_id(t))
            .or_else(|| {
                config
                    .get("bos_token_id")
                    .and_then(Value::as_u64)
                    .map(|v| v as u32)
            });
        let mut eos_token_ids: Vec<u32> = match config.get("eos_token_id") {
            Some(Value::Number(n)) => n.as_u64().map(|v| v as u32).into_iter().collect(),
            Some(Value::Array(a)) => a
                .iter()
                .filter_map(Value::as_u64)
                .map(|v| v as u32)
                .collect(),
            _ => vec![],
        };
        if let Some(id) = token_text(tc.get("eos_token")).and_then(|t| inner.token_to_id(&t)) {
            eos_token_ids.push(id);
        }
        eos_token_ids.sort_unstable();
        eos_token_ids.dedup();
        let chat_template = std::fs::read_to_string(dir.join("chat_template.jinja"))
            .ok()
            .or_else(|| match tc.get("chat_template") {
                Some(Value::String(s)) => Some(s.clone()),
                Some(Value::Array(list)) => list
                    .iter()
                    .find(|t| t.get("name").and_then(Value::as_str) == Some("default"))
                    .or_else(|| list.first())
                    .and_then(|t| t.get("template").and_then(Value::as_str).map(str::to_owned)),
                _ => None,
            });
        Ok(Tokenizer {
            inner,
            bos_token_id,
            eos_token_ids,
            add_bos: tc
                .get("add_bos_token")
                .and_then(Value::as_bool)
                .unwrap_or(false),
            chat_template,
        })
    }

    /// Token ids of `text`; special tokens written in the text (`<|im_start|>`) are recognised.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        let enc = self.inner.encode(text, false).map_err(tok_err)?;
        Ok(enc.get_ids().to_vec())
    }

    /// Ids of a plain prompt, with BOS first when the model wants it.
    pub fn encode_prompt(&self, text: &str) -> Result<Vec<u32>> {
        let mut ids = Vec::new();
        if self.add_bos {
            ids.extend(self.bos_token_id);
        }
        ids.extend(self.encode(text)?);
        Ok(ids)
    }

    /// Text of `ids`; `skip_special` drops control tokens such as `<|im_end|>`.
    pub fn decode(&self, ids: &[u32], skip_special: bool) -> Result<String> {
        self.inner.decode(ids, skip_special).map_err(tok_err)
    }

    /// Text of one token as the vocabulary spells it (`Ġthe`), for diagnostics.
    pub fn id_to_token(&self, id: u32) -> Option<String> {
        self.inner.id_to_token(id)
    }

    /// The tokenizer as Hugging Face `tokenizer.json` text.
    pub fn to_json(&self) -> Result<String> {
        self.inner.to_string(false).map_err(tok_err)
    }

    /// Size of the vocabulary, added tokens included.
    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    /// Text of a token id, or empty.
    fn token_text(&self, id: Option<u32>) -> String {
        id.and_then(|i| self.inner.id_to_token(i))
            .unwrap_or_default()
    }

    /// Renders the chat template for `messages` (with the assistant's turn opened when
    /// `add_generation_prompt`).
    pub fn apply_chat_template(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> Result<String> {
        let template = self.chat_template.as_deref().ok_or_else(|| {
            InferenceError::ChatTemplate(
                "the model has no chat template; send a plain prompt".into(),
            )
        })?;
        let bos = self.token_text(self.bos_token_id);
        let eos = self.token_text(self.eos_token_ids.first().copied());
        render_chat_template(template, messages, add_generation_prompt, &bos, &eos)
    }
}

/// Renders a Hugging Face chat template the way `transformers` does: Jinja with
/// `trim_blocks` and `lstrip_blocks`, loop controls, Python string methods, and the
/// `raise_exception` and `strftime_now` helpers.
pub fn render_chat_template(
    template: &str,
    messages: &[ChatMessage],
    add_generation_prompt: bool,
    bos_token: &str,
    eos_token: &str,
) -> Result<String> {
    use minijinja::{context, Environment, Error, ErrorKind};
    let err = |e: Error| InferenceError::ChatTemplate(e.to_string());
    let mut env = Environment::new();
    env.set_syntax(
        minijinja::syntax::SyntaxConfig::builder()
            .trim_blocks(true)
            .lstrip_blocks(true)
            .build()
            .map_err(err)?,
    );
    env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
    env.add_function("raise_exception", |msg: String| -> Result<String, Error> {
        Err(Error::new(ErrorKind::InvalidOperation, msg))
    });
    // Dates are not deterministic; templates that print one get a fixed neutral date.
    env.add_function("strftime_now", |_format: String| -> String {
        "01 Jan 2025".to_owned()
    });
    env.add_template("chat", template).map_err(err)?;
    let tpl = env.get_template("chat").map_err(err)?;
    tpl.render(context! {
        messages => minijinja::Value::from(minijinja::value::Serde(messages)),
        add_generation_prompt => add_generation_prompt,
        bos_token => bos_token,
        eos_token => eos_token,
    })
    .map_err(err)
}
