//! Constrained decoding: output that must match a JSON Schema, any JSON object, or a Lark
//! grammar (OpenAI's `response_format`, Responses' `text.format`, Ollama's `format`, forced
//! tool calls). The grammar engine is `llguidance` (what llama.cpp and vLLM use) over the
//! model's vocabulary ([`vocab`]): per sequence a [`Grammar`] yields the tokens allowed next,
//! the sampler masks every other logit (see [`crate::sampling::Sampler::sample`] for the
//! order with penalties and `logit_bias`), and the chosen token is committed back. An end
//! token is allowed only once the grammar accepts, and is then the only choice when the
//! grammar can take nothing more.
//!
//! **Limits.** A constraint's text is at most [`MAX_CONSTRAINT_BYTES`]; llguidance's own fuel
//! limits bound the compile and each step's mask (its defaults, a few milliseconds a step);
//! a compile slower than [`MAX_COMPILE`] or a mask slower than [`MAX_MASK`] is refused, so a
//! pathological schema ends its own request with a clear error and never stalls a batch.
//! Compiled grammars are cached per tokenizer by their exact text ([`GrammarCompiler`]).

mod vocab;

use crate::error::{Result, TextError};
use crate::tokenizer::Tokenizer;
use llguidance::api::TopLevelGrammar;
use llguidance::{Matcher, ParserFactory};
use serde_json::Value;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use toktrie::{SimpleVob, TokEnv, TokTrie};
use wire::constraint::OutputConstraint;

/// Largest constraint text accepted (a schema or grammar of this size compiles in well under
/// a second; real response formats are a few kilobytes).
pub const MAX_CONSTRAINT_BYTES: usize = 64 * 1024;
/// Longest a grammar may take to compile (and compute its first mask).
pub const MAX_COMPILE: Duration = Duration::from_secs(2);
/// Longest one step's mask may take before the request is ended with an error.
pub const MAX_MASK: Duration = Duration::from_millis(200);
/// Compiled grammars kept per tokenizer.
const CACHE_ENTRIES: usize = 64;

/// The grammar llguidance compiles. JSON comes out with `", "` and `": "` between items
/// and no other whitespace: a model cannot fill its budget with blank lines, and the
/// text reads as the templates' own `tojson` writes it.
/// `trie`: the vocabulary, which says which of a grammar's control tokens are special.
fn grammar(constraint: &OutputConstraint, trie: &TokTrie) -> Result<TopLevelGrammar> {
    let text = match constraint {
        OutputConstraint::JsonObject => "{\"type\": \"object\"}",
        OutputConstraint::JsonSchema { schema } => schema.as_str(),
        OutputConstraint::Lark { grammar } => {
            let special = |token: &str| trie.get_special_token(token);
            let grammar = resolve_controls(&resolve_lazy_start(grammar, special), special);
            return Ok(TopLevelGrammar::from_lark(grammar));
        }
    };
    let mut schema: Value = serde_json::from_str(text)
        .map_err(|e| invalid(format!("the JSON schema is not valid JSON: {e}")))?;
    with_compact_json(&mut schema);
    Ok(TopLevelGrammar::from_json_schema(schema))
}

/// A forced call's grammar with its control tokens made to fit this vocabulary: each line
/// `ctl_N: "TOKEN"` (how `dialects::tools::call_grammar` writes a family's control tokens)
/// becomes a reference to the token by its id (`<[ID]>`) where `special_id(TOKEN)` finds it
/// special in the vocabulary, and stays text otherwise (the tokenizer holds it as ordinary,
/// as DeepSeek publishes its tool markers). Other lines are left as they are: a schema is one
/// line of JSON and cannot start with `ctl_`.
pub fn resolve_controls(grammar: &str, special_id: impl Fn(&str) -> Option<u32>) -> String {
    grammar
        .split_inclusive('\n')
        .map(|line| {
            let body = line.trim_end_matches('\n');
            let token = body.split_once(": ").and_then(|(name, text)| {
                let numbered = name
                    .strip_prefix("ctl_")
                    .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()));
                let token: String = serde_json::from_str(text).ok()?;
                numbered.then_some((name, token))
            });
            match token.and_then(|(name, token)| Some((name, special_id(&token)?))) {
                Some((name, id)) => format!("{name}: <[{id}]>{}", &line[body.len()..]),
                None => line.to_string(),
            }
        })
        .collect()
}

/// A lazy call grammar's first line (`dialects::tools::lazy_grammar`, `strict` tools under
/// `auto`), `lazy_start: "TOKEN" REST`, made into the start rule that fits this vocabulary:
/// where `special_id(TOKEN)` finds TOKEN special, free text is any token but it and a call
/// starts with it (`start: lazy_free (<[ID]> REST lazy_free)*`); otherwise free text is text
/// and a call starts where the text ends with TOKEN (a lazy lexeme, which llguidance commits
/// at its first match, so no text can hold the marker without the call that must follow).
/// A grammar without such a first line is returned as it is.
pub fn resolve_lazy_start(grammar: &str, special_id: impl Fn(&str) -> Option<u32>) -> String {
    let Some(line) = grammar.strip_prefix("lazy_start: ") else {
        return grammar.to_string();
    };
    let (line, others) = line.split_once('\n').unwrap_or((line, ""));
    let mut stream = serde_json::Deserializer::from_str(line).into_iter::<String>();
    let Some(Ok(token)) = stream.next() else {
        return grammar.to_string();
    };
    let rest = line[stream.byte_offset()..].trim();
    let start = match special_id(&token) {
        Some(id) => {
            format!("start: lazy_free (<[{id}]> {rest} lazy_free)*\nlazy_free: <[^{id}]>*\n")
        }
        None => format!(
            "start: (lazy_head {rest})* lazy_tail\nlazy_head[lazy]: LAZY_TEXT {}\n\
             lazy_tail: LAZY_TEXT\nLAZY_TEXT: /(?s:.*)/\n",
            serde_json::to_string(&token).unwrap_or_default()
        ),
    };
    format!("{start}{others}")
}

/// The JSON layout llguidance is asked for (see [`grammar`]), unless the
/// schema names its own.
pub fn with_compact_json(schema: &mut Value) {
    if let Some(object) = schema.as_object_mut() {
        object.entry("x-guidance").or_insert_with(|| {
            serde_json::json!({
                "whitespace_flexible": false,
                "item_separator": ", ",
                "key_separator": ": "
            })
        });
    }
}

fn invalid(message: String) -> TextError {
    TextError::InvalidRequest(message)
}

/// Compiles constraints for one tokenizer and keeps the compiled grammars by their text.
pub struct GrammarCompiler {
    factory: ParserFactory,
    env: TokEnv,
    cache: Mutex<HashMap<OutputConstraint, Matcher>>,
}

impl std::fmt::Debug for GrammarCompiler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GrammarCompiler")
            .field("vocab", &self.env.tok_trie().vocab_size())
            .finish()
    }
}

impl GrammarCompiler {
    /// A compiler over `env` (llguidance's default limits, logging off).
    pub fn new(env: TokEnv) -> Result<GrammarCompiler> {
        let mut factory = ParserFactory::new_simple(&env)
            .map_err(|e| TextError::Tokenizer(format!("grammar engine: {e}")))?;
        factory.quiet();
        Ok(GrammarCompiler {
            factory,
            env,
            cache: Mutex::new(HashMap::new()),
        })
    }

    /// The per-sequence state of `constraint`, compiled (or taken from the cache). Errors are
    /// the request's fault: an unsupported keyword (named), a grammar too large or too slow.
    pub fn start(&self, constraint: &OutputConstraint) -> Result<Grammar> {
        if constraint.text_len() > MAX_CONSTRAINT_BYTES {
            return Err(invalid(format!(
                "the schema or grammar is {} bytes; at most {MAX_CONSTRAINT_BYTES} are accepted",
                constraint.text_len()
            )));
        }
        let cached = self
            .cache
            .lock()
            .ok()
            .and_then(|c| c.get(constraint).map(Matcher::deep_clone));
        let matcher = match cached {
            Some(m) => m,
            None => {
                let fresh = self.compile(constraint)?;
                if let Ok(mut cache) = self.cache.lock() {
                    if cache.len() >= CACHE_ENTRIES {
                        cache.clear();
                    }
                    cache.insert(constraint.clone(), fresh.deep_clone());
                }
                fresh
            }
        };
        Ok(Grammar {
            matcher,
            env: self.env.clone(),
            next_mask: None,
            mask_time: Duration::ZERO,
        })
    }

    fn compile(&self, constraint: &OutputConstraint) -> Result<Matcher> {
        let start = Instant::now();
        let parser = self
            .factory
            .create_parser(grammar(constraint, self.env.tok_trie())?)
            .map_err(|e| invalid(describe_compile_error(&e.to_string())))?;
        let mut matcher = Matcher::new(Ok(parser));
        // The first mask compiles most of the lexer: its time counts as the compile's.
        let first = matcher.compute_mask();
        if let Err(e) = first {
            return Err(invalid(describe_compile_error(&e.to_string())));
        }
        let took = start.elapsed();
        if took > MAX_COMPILE {
            return Err(invalid(format!(
                "the schema or grammar took {} ms to compile (at most {} ms); simplify it",
                took.as_millis(),
                MAX_COMPILE.as_millis()
            )));
        }
        tracing::debug!(
            ms = took.as_secs_f64() * 1e3,
            "compiled an output constraint"
        );
        Ok(matcher)
    }
}

/// llguidance's compile error as the API answers it: an unsupported keyword named first.
fn describe_compile_error(message: &str) -> String {
    if let Some(rest) = message.split("Unimplemented keys: ").nth(1) {
        let keys = rest.lines().next().unwrap_or(rest);
        return format!(
            "the JSON schema uses keywords that constrained decoding cannot enforce: {keys}; \
             remove them"
        );
    }
    let first = message.lines().next().unwrap_or(message);
    format!("the schema or grammar cannot be enforced: {first}")
}

impl Tokenizer {
    /// This tokenizer's grammar compiler for a model of `logits` outputs (made on first use:
    /// building the token trie takes a pass over the vocabulary).
    pub fn grammar_compiler(&self, logits: usize) -> Result<Arc<GrammarCompiler>> {
        let made = self.grammar.get_or_init(|| {
            GrammarCompiler::new(self.grammar_env(logits))
                .map(Arc::new)
                .map_err(|e| e.to_string())
        });
        made.clone().map_err(TextError::Tokenizer)
    }
}

/// One sequence's place in its grammar: what may come next, and the tokens taken so far.
pub struct Grammar {
    matcher: Matcher,
    env: TokEnv,
    /// The mask for the next step, when computed ahead ([`Grammar::prepare`]).
    next_mask: Option<Result<SimpleVob>>,
    /// Time spent computing masks, for the benchmark and logs.
    mask_time: Duration,
}

impl std::fmt::Debug for Grammar {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Grammar")
            .field("mask_time", &self.mask_time)
            .finish()
    }
}

impl Clone for Grammar {
    fn clone(&self) -> Self {
        Grammar {
            matcher: self.matcher.deep_clone(),
            env: self.env.clone(),
            next_mask: None,
            mask_time: self.mask_time,
        }
    }
}

impl Grammar {
    /// Computes the next step's mask now (on another thread while the step runs, see
    /// `inference::batch::Batcher`), so that sampling finds it ready.
    pub fn prepare(&mut self) {
        if self.next_mask.is_none() {
            let mask = self.compute();
            self.next_mask = Some(mask);
        }
    }

    fn compute(&mut self) -> Result<SimpleVob> {
        let start = Instant::now();
        // A grammar that is complete (nothing more can follow) allows only the end.
        let mask = self.matcher.compute_mask_or_eos().map_err(|e| {
            invalid(format!(
                "the output constraint failed: {}",
                e.to_string().lines().next().unwrap_or_default()
            ))
        });
        let took = start.elapsed();
        self.mask_time += took;
        if took > MAX_MASK {
            return Err(invalid(format!(
                "the output constraint took {} ms for one token (at most {} ms); simplify the \
                 schema",
                took.as_millis(),
                MAX_MASK.as_millis()
            )));
        }
        let mut mask = mask?;
        // The model's end tokens: allowed exactly when the grammar accepts.
        let trie = self.env.tok_trie();
        let accepting = self.matcher.is_accepting().unwrap_or(false);
        for &end in trie.eos_tokens() {
            mask.set(end as usize, accepting);
        }
        Ok(mask)
    }

    /// Sets every logit the grammar does not allow at this step to `-inf` (ids past the
    /// vocabulary too). Errors end the request (an internal grammar error, a mask too slow).
    pub fn mask(&mut self, logits: &mut [f32]) -> Result<()> {
        let mask = match self.next_mask.take() {
            Some(m) => m?,
            None => self.compute()?,
        };
        if mask.num_set() == 0 {
            return Err(invalid(format!(
                "the output constraint allows no token here (stopped: {:?})",
                self.matcher.stop_reason()
            )));
        }
        for (id, l) in logits.iter_mut().enumerate() {
            if id >= mask.len() || !mask.is_allowed(id as u32) {
                *l = f32::NEG_INFINITY;
            }
        }
        Ok(())
    }

    /// Advances past the sampled `token` (an end token is not part of the text and is not
    /// committed).
    pub fn commit(&mut self, token: u32) -> Result<()> {
        self.next_mask = None;
        if self.env.tok_trie().eos_tokens().contains(&token) {
            return Ok(());
        }
        self.matcher.consume_token(token).map_err(|e| {
            invalid(format!(
                "the sampled token does not fit the output constraint: {}",
                e.to_string().lines().next().unwrap_or_default()
            ))
        })
    }

    /// Whether the text so far is complete under the grammar.
    pub fn accepts(&mut self) -> bool {
        self.matcher.is_accepting().unwrap_or(false)
    }

    /// Time spent computing this sequence's masks.
    pub fn mask_time(&self) -> Duration {
        self.mask_time
    }
}

#[cfg(test)]
mod tests;
