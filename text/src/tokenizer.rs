//! Tokenizer and chat template: from a Hugging Face folder (`tokenizer.json`,
//! `tokenizer_config.json`) or rebuilt from the vocabulary, merges and template that a GGUF
//! file carries in its metadata.

pub use crate::chat_template::ChatMessage;
use crate::chat_template::{render_template, TemplateClock, TemplateInput};
use crate::error::{Result, TextError};
use formats::gguf::{GgufFile, GgufValue};
use serde_json::{json, Value};
use std::path::Path;
use std::str::FromStr;

/// Llama 3's pre-tokenizer split (GGUF `tokenizer.ggml.pre = llama-bpe`).
const LLAMA3_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// Qwen2's pre-tokenizer split (GGUF `tokenizer.ggml.pre = qwen2`).
const QWEN2_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// Qwen3.5's split: Qwen2's, with combining marks (`\p{M}`) kept inside words.
const QWEN35_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// DeepSeek LLM's splits, applied one after the other: line breaks, runs of cased letters
/// (the Latin, Greek, Cyrillic, ... letters that have case), ASCII and full-width
/// punctuation, trailing spaces, CJK and Hangul runs.
const DEEPSEEK_LLM_SPLITS: &[&str] = &[
    "[\r\n]",
    "\\s?[A-Za-z\u{b5}\u{c0}-\u{d6}\u{d8}-\u{f6}\u{f8}-\u{1ba}\u{1bc}-\u{1bf}\u{1c4}-\u{293}\u{295}-\u{2af}\u{370}-\u{373}\u{376}\u{377}\u{37b}-\u{37d}\u{37f}\u{386}\u{388}-\u{38a}\u{38c}\u{38e}-\u{3a1}\u{3a3}-\u{3f5}\u{3f7}-\u{481}\u{48a}-\u{52f}\u{531}-\u{556}\u{10a0}-\u{10c5}\u{13a0}-\u{13f5}\u{13f8}-\u{13fd}\u{1c90}-\u{1cba}\u{1cbd}-\u{1cbf}\u{1d00}-\u{1d2b}\u{1d6b}-\u{1d77}\u{1d79}-\u{1d9a}\u{1e00}-\u{1f15}\u{1f18}-\u{1f1d}\u{1f20}-\u{1f45}\u{1f48}-\u{1f4d}\u{1f50}-\u{1f57}\u{1f59}\u{1f5b}\u{1f5d}\u{1f5f}-\u{1f7d}\u{1f80}-\u{1fb4}\u{1fb6}-\u{1fbc}\u{1fbe}\u{1fc2}-\u{1fc4}\u{1fc6}-\u{1fcc}\u{1fd0}-\u{1fd3}\u{1fd6}-\u{1fdb}\u{1fe0}-\u{1fec}\u{1ff2}-\u{1ff4}\u{1ff6}-\u{1ffc}\u{2102}\u{2107}\u{210a}-\u{2113}\u{2115}\u{2119}-\u{211d}\u{2124}\u{2126}\u{2128}\u{212a}-\u{212d}\u{212f}-\u{2134}\u{2139}\u{213c}-\u{213f}\u{2145}-\u{2149}\u{214e}\u{2183}\u{2184}\u{2c00}-\u{2c7b}\u{2c7e}-\u{2ce4}\u{2ceb}-\u{2cee}\u{2cf2}\u{2cf3}\u{a640}-\u{a66d}\u{a680}-\u{a69b}\u{a722}-\u{a76f}\u{a771}-\u{a787}\u{a78b}-\u{a78e}\u{ab70}-\u{abbf}\u{fb00}-\u{fb06}\u{fb13}-\u{fb17}\u{ff21}-\u{ff3a}\u{ff41}-\u{ff5a}\u{10400}-\u{1044f}\u{104b0}-\u{104d3}\u{104d8}-\u{104fb}\u{10c80}-\u{10cb2}\u{10cc0}-\u{10cf2}\u{118a0}-\u{118df}\u{1e900}-\u{1e943}]+",
    "\\s?[!-/:-~\u{ff01}-\u{ff0f}\u{ff1a}-\u{ff5e}\u{2018}-\u{201f}\u{3000}-\u{3002}]+",
    "\\s+$",
    "[\u{4e00}-\u{9fa5}\u{800}-\u{4e00}\u{ac00}-\u{d7ff}]+",
];
/// DeepSeek Coder's splits: line breaks, letter runs, punctuation runs, CJK and Hangul runs.
const DEEPSEEK_CODER_SPLITS: &[&str] = &[
    "[\r\n]",
    "\\s?\\p{L}+",
    "\\s?\\p{P}+",
    "[\u{4e00}-\u{9fa5}\u{800}-\u{4e00}\u{ac00}-\u{d7ff}]+",
];
/// Falcon's last split: digits in groups of three.
const FALCON_DIGIT_GROUPS: &str = "[0-9][0-9][0-9]";

/// Control tokens that spell tool calls and reasoning in each family's dialect (Hermes/Qwen,
/// Llama 3.1, Mistral, GLM, MiniMax, Kimi, DeepSeek, gpt-oss harmony). Decoding skips special
/// tokens, but these stay in the text, so that the gateway can parse the calls out of it
/// (`dialects::tools`); they are marked as ordinary added tokens, which changes nothing in how
/// the template's text is encoded. Those that were special stay control tokens that a
/// client's text cannot spell ([`Tokenizer::kept_controls`], `untrusted_text`).
pub const TOOL_MARKUP_TOKENS: &[&str] = &[
    "<tool_call>",
    "</tool_call>",
    "<|python_tag|>",
    "[TOOL_CALLS]",
    "[ARGS]",
    "[CALL_ID]",
    "<think>",
    "</think>",
    // GLM-4.5/4.6/4.7.
    "<arg_key>",
    "</arg_key>",
    "<arg_value>",
    "</arg_value>",
    // MiniMax M2.
    "<minimax:tool_call>",
    "</minimax:tool_call>",
    // Kimi K2.
    "<|tool_calls_section_begin|>",
    "<|tool_calls_section_end|>",
    "<|tool_call_begin|>",
    "<|tool_call_argument_begin|>",
    "<|tool_call_end|>",
    // DeepSeek V3/V3.1.
    "<｜tool▁calls▁begin｜>",
    "<｜tool▁calls▁end｜>",
    "<｜tool▁call▁begin｜>",
    "<｜tool▁call▁end｜>",
    "<｜tool▁sep｜>",
    // gpt-oss harmony.
    "<|start|>",
    "<|channel|>",
    "<|message|>",
    "<|constrain|>",
    "<|end|>",
    "<|call|>",
    "<|return|>",
    // Gemma 4.
    "<|tool_call>",
    "<tool_call|>",
    "<|\"|>",
    // MiniMax M3.
    "]<]minimax[>[",
    "<mm:think>",
    "</mm:think>",
];

/// The most bytes [`Tokenizer::holds_more_than`] encodes at once.
pub const COUNT_PIECE_BYTES: usize = 16 * 1024;

/// The most tokens a cut between two pieces may add to their count (a word cut in two).
pub const CUT_SLACK_TOKENS: usize = 4;

/// `text`'s first piece for [`Tokenizer::holds_more_than`] and the rest: at most
/// [`COUNT_PIECE_BYTES`], ending before the last whitespace in it where there is one, else at
/// a character boundary.
fn split_piece(text: &str) -> (&str, &str) {
    if text.len() <= COUNT_PIECE_BYTES {
        return (text, "");
    }
    let mut end = COUNT_PIECE_BYTES;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    let window = &text[..end];
    let cut = window
        .rfind(char::is_whitespace)
        .filter(|&at| at > 0)
        .unwrap_or(end);
    text.split_at(cut)
}

/// A tokenizer with the model's special tokens and chat template.
pub struct Tokenizer {
    pub(crate) inner: tokenizers::Tokenizer,
    /// The same tokenizer with special-token matching off, for the text of messages (made on
    /// first use, see [`crate::untrusted_text`]).
    pub(crate) plain: std::sync::OnceLock<tokenizers::Tokenizer>,
    /// The longest vocabulary piece in bytes (made on first use, see
    /// [`Tokenizer::surely_longer_than`]).
    pub(crate) longest_piece: std::sync::OnceLock<usize>,
    /// The grammar compiler over this vocabulary (made on first use, see
    /// [`Tokenizer::grammar_compiler`]).
    pub(crate) grammar: std::sync::OnceLock<
        std::result::Result<std::sync::Arc<crate::constraint::GrammarCompiler>, String>,
    >,
    /// Beginning-of-sequence token, if the model has one.
    pub bos_token_id: Option<u32>,
    /// Tokens that end generation.
    pub eos_token_ids: Vec<u32>,
    /// Whether plain (non-chat) prompts start with the BOS token.
    pub add_bos: bool,
    /// The chat template (Jinja source), if the model has one.
    pub chat_template: Option<String>,
    /// The date the template's `strftime_now` tells: the system clock (UTC) unless a test
    /// pins it.
    pub template_clock: TemplateClock,
    /// Special tokens of [`TOOL_MARKUP_TOKENS`] made ordinary so that decoding keeps them:
    /// still control tokens for a client's text, which cannot spell them.
    pub kept_controls: Vec<String>,
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

fn tok_err(e: impl std::fmt::Display) -> TextError {
    TextError::Tokenizer(e.to_string())
}

/// A token id or a list of them (`eos_token_id` in config.json or generation_config.json).
fn token_ids(value: Option<&Value>) -> Vec<u32> {
    let id = |v: &Value| v.as_u64().and_then(|v| u32::try_from(v).ok());
    match value {
        Some(Value::Array(a)) => a.iter().filter_map(id).collect(),
        Some(v) => id(v).into_iter().collect(),
        None => Vec::new(),
    }
}

impl Tokenizer {
    /// Rebuilds the tokenizer from GGUF metadata (byte-level BPE models only).
    pub fn from_gguf(file: &GgufFile) -> Result<Tokenizer> {
        let model = file
            .get("tokenizer.ggml.model")
            .and_then(GgufValue::as_str)
            .unwrap_or("");
        if model != "gpt2" {
            return Err(TextError::Tokenizer(format!(
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
        let mut kept_controls = Vec::new();
        for (id, tok) in tokens.iter().enumerate() {
            vocab.insert(tok.clone(), json!(id));
            let ty = types.get(id).copied().unwrap_or(1);
            if ty == 3 && TOOL_MARKUP_TOKENS.contains(&tok.as_str()) {
                kept_controls.push(tok.clone());
            }
            if ty == 3 || ty == 4 {
                added.push(json!({
                    "id": id, "content": tok, "single_word": false, "lstrip": false,
                    "rstrip": false, "normalized": false,
                    "special": ty == 3 && !TOOL_MARKUP_TOKENS.contains(&tok.as_str()),
                }));
            }
        }
        let byte_level = |use_regex: bool| json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": use_regex});
        let split = |pattern: &str| json!({"type": "Split", "pattern": {"Regex": pattern}, "behavior": "Isolated", "invert": false});
        let splits =
            |patterns: &[&str]| -> Vec<Value> { patterns.iter().map(|p| split(p)).collect() };
        let sequence = |steps: Vec<Value>| json!({"type": "Sequence", "pretokenizers": steps});
        // What llama.cpp does for each `tokenizer.ggml.pre`, written as the Hugging Face
        // pre-tokenizer of the model it came from. `ignore_merges`: a word that is a token of
        // its own is taken whole, even where the merges would not reach it (Llama 3).
        let mut ignore_merges = false;
        let (normalizer, pre_tokenizer) = match pre {
            "smollm" | "starcoder" | "refact" | "command-r" | "codeshell" | "exaone"
            | "minerva-7b" => (
                Value::Null,
                sequence(vec![
                    json!({"type": "Digits", "individual_digits": true}),
                    byte_level(true),
                ]),
            ),
            "llama-bpe" | "llama3" | "falcon3" | "falcon-h1" | "pixtral" => {
                ignore_merges = true;
                (
                    Value::Null,
                    sequence(vec![split(LLAMA3_SPLIT), byte_level(false)]),
                )
            }
            "smaug-bpe" | "dbrx" => (
                Value::Null,
                sequence(vec![split(LLAMA3_SPLIT), byte_level(false)]),
            ),
            "qwen2" | "deepseek-r1-qwen" | "stablelm2" | "hunyuan" => (
                json!({"type": "NFC"}),
                sequence(vec![split(QWEN2_SPLIT), byte_level(false)]),
            ),
            // No NFC here: Qwen3.5 keeps combining marks as written (`e` + U+0301 stays two
            // tokens).
            "qwen35" => (
                Value::Null,
                sequence(vec![split(QWEN35_SPLIT), byte_level(false)]),
            ),
            "deepseek-llm" => {
                let mut steps = splits(DEEPSEEK_LLM_SPLITS);
                steps.push(json!({"type": "Digits", "individual_digits": false}));
                steps.push(byte_level(false));
                (Value::Null, sequence(steps))
            }
            "deepseek-coder" => {
                let mut steps = splits(DEEPSEEK_CODER_SPLITS);
                steps.push(json!({"type": "Digits", "individual_digits": true}));
                steps.push(byte_level(false));
                (Value::Null, sequence(steps))
            }
            "falcon" => (
                Value::Null,
                sequence(vec![
                    json!({"type": "Punctuation", "behavior": "Contiguous"}),
                    byte_level(true),
                    json!({"type": "Digits", "individual_digits": false}),
                    split(FALCON_DIGIT_GROUPS),
                ]),
            ),
            "gpt-2" | "gpt2" | "mpt" | "olmo" | "jais" => (Value::Null, byte_level(true)),
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
                "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false, "ignore_merges": ignore_merges,
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
        // Chat models end a turn with their end-of-turn token even when EOS is another one;
        // not harmony's `<|end|>`, which ends a message (the reasoning) and not the answer.
        let harmony = tokens.iter().any(|t| t == "<|channel|>");
        for end in ["<|im_end|>", "<|eot_id|>", "<|endoftext|>", "<|end|>"] {
            if harmony && end == "<|end|>" {
                continue;
            }
            if let Some(i) = tokens.iter().position(|t| t == end) {
                if types.get(i) == Some(&3) {
                    eos_token_ids.push(i as u32);
                }
            }
        }
        eos_token_ids.sort_unstable();
        eos_token_ids.dedup();
        Ok(Tokenizer {
            plain: std::sync::OnceLock::new(),
            longest_piece: std::sync::OnceLock::new(),
            grammar: std::sync::OnceLock::new(),
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
            template_clock: TemplateClock::default(),
            kept_controls,
        })
    }

    /// Loads `tokenizer.json` and `tokenizer_config.json` (and `chat_template.jinja` if
    /// present) from a Hugging Face folder; `config` is the model's config.json.
    pub fn from_hf_dir(dir: &Path, config: &Value) -> Result<Tokenizer> {
        let path = dir.join("tokenizer.json");
        let text = std::fs::read_to_string(&path)
            .map_err(|e| tok_err(format!("{}: {e}", path.display())))?;
        let mut json: Value =
            serde_json::from_str(&text).map_err(|e| tok_err(format!("{}: {e}", path.display())))?;
        let mut kept_controls = Vec::new();
        if let Some(added) = json.get_mut("added_tokens").and_then(Value::as_array_mut) {
            for token in added {
                let content = token.get("content").and_then(Value::as_str).unwrap_or("");
                if TOOL_MARKUP_TOKENS.contains(&content) {
                    if token.get("special") == Some(&Value::Bool(true)) {
                        kept_controls.push(content.to_string());
                    }
                    token["special"] = Value::Bool(false);
                }
            }
        }
        let inner = tokenizers::Tokenizer::from_str(&json.to_string())
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
        // generation_config.json lists the tokens generation stops at, as transformers reads
        // it: gpt-oss ends a tool call with `<|call|>`, which only that file names.
        let generation: Value = std::fs::read_to_string(dir.join("generation_config.json"))
            .ok()
            .and_then(|s| serde_json::from_str(&s).ok())
            .unwrap_or(Value::Null);
        let mut eos_token_ids: Vec<u32> = [config, &generation]
            .into_iter()
            .flat_map(|c| token_ids(c.get("eos_token_id")))
            .collect();
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
            plain: std::sync::OnceLock::new(),
            longest_piece: std::sync::OnceLock::new(),
            grammar: std::sync::OnceLock::new(),
            inner,
            bos_token_id,
            eos_token_ids,
            add_bos: tc
                .get("add_bos_token")
                .and_then(Value::as_bool)
                .unwrap_or(false),
            chat_template,
            template_clock: TemplateClock::default(),
            kept_controls,
        })
    }

    /// Whether `bytes` bytes of text surely make more than `tokens` tokens, known without
    /// tokenizing them: no token stands for more bytes than the longest vocabulary piece
    /// spells (a byte-level piece spells each byte as one or two characters, a SentencePiece
    /// one its space as three bytes), and normalizers shrink text by far less than the
    /// factor of 4 allowed here. A prompt refused by it would have been refused after
    /// tokenizing, at the cost of the whole encoding in memory (7 M tokens took 2.1 GB).
    pub fn surely_longer_than(&self, bytes: usize, tokens: usize) -> bool {
        let longest = *self.longest_piece.get_or_init(|| {
            self.inner
                .get_vocab(true)
                .keys()
                .map(String::len)
                .max()
                .unwrap_or(1)
                .max(1)
        });
        bytes / 4 / longest > tokens
    }

    /// Whether `texts` together surely hold more than `tokens` tokens, found by encoding them
    /// a piece of at most [`COUNT_PIECE_BYTES`] at a time and stopping as soon as the count
    /// passes: memory stays that of one piece, however long the text (a 1 MB system prompt
    /// encoded whole grew the node by 141 MB before its 400). Pieces end before whitespace
    /// where they can, where byte-level pre-tokenizers split anyway; each cut is still allowed
    /// to have added [`CUT_SLACK_TOKENS`], so the answer is true only when the text surely does.
    pub fn holds_more_than<'t>(
        &self,
        texts: impl IntoIterator<Item = &'t str>,
        tokens: usize,
    ) -> Result<bool> {
        let mut counted = 0usize;
        let mut cuts = 0usize;
        for text in texts {
            let mut rest = text;
            while !rest.is_empty() {
                let (piece, after) = split_piece(rest);
                counted += self.inner.encode(piece, false).map_err(tok_err)?.len();
                if !after.is_empty() {
                    cuts += 1;
                }
                if counted.saturating_sub(cuts * CUT_SLACK_TOKENS) > tokens {
                    return Ok(true);
                }
                rest = after;
            }
        }
        Ok(false)
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
        self.render_chat(&TemplateInput {
            messages,
            add_generation_prompt,
            ..TemplateInput::default()
        })
    }

    /// Renders the chat template for `input` (tools, tool calls and results, template
    /// switches), with this model's special tokens in place of the input's.
    pub fn render_chat(&self, input: &TemplateInput) -> Result<String> {
        let template = self.chat_template.as_deref().ok_or_else(|| {
            TextError::ChatTemplate("the model has no chat template; send a plain prompt".into())
        })?;
        let bos = self.token_text(self.bos_token_id);
        let eos = self.token_text(self.eos_token_ids.first().copied());
        let input = TemplateInput {
            bos_token: &bos,
            eos_token: &eos,
            ..*input
        };
        render_template(template, &input, &self.template_clock)
    }
}
