//! The mask and the sampler together, over a vocabulary of one token per byte (and an end
//! token): the sampler's own logits prefer prose, the constraint makes the text fit.

use super::*;
use crate::sampling::Sampler;
use toktrie::{ApproximateTokEnv, TokenizerEnv};
use wire::sampling::SamplingParams;

/// Byte tokens 0..=255, then special tokens; the last, `<|end|>`, ends generation.
fn compiler() -> GrammarCompiler {
    GrammarCompiler::new(ApproximateTokEnv::single_byte_env()).unwrap()
}

fn end_token() -> u32 {
    ApproximateTokEnv::single_byte().tok_trie().eos_token()
}

fn schema(value: Value) -> OutputConstraint {
    OutputConstraint::JsonSchema {
        schema: value.to_string(),
    }
}

/// Logits that favour `x` and then a lowercase letter (what an unconstrained sampler writes).
fn prose_logits(vocab: usize, step: usize) -> Vec<f32> {
    (0..vocab)
        .map(|t| match t as u8 {
            _ if t >= 256 => 0.5,
            b'x' => 3.0,
            b'a'..=b'z' => 2.0 + ((t + step) % 7) as f32 * 0.1,
            b'0'..=b'9' => 1.0,
            _ => 0.0,
        })
        .collect()
}

/// Samples with `params` under `constraint` until the end token or `limit` tokens.
fn run(constraint: &OutputConstraint, params: SamplingParams, limit: usize) -> (String, bool) {
    let compiler = compiler();
    let vocab = compiler.env.tok_trie().vocab_size();
    let mut sampler = Sampler::new(params).with_grammar(compiler.start(constraint).unwrap());
    let mut text = Vec::new();
    let mut context = Vec::new();
    for step in 0..limit {
        let s = sampler
            .sample(&prose_logits(vocab, step), &context, step)
            .unwrap();
        if s.token == end_token() {
            return (String::from_utf8(text).unwrap(), true);
        }
        context.push(s.token);
        text.push(s.token as u8);
    }
    (String::from_utf8(text).unwrap(), false)
}

fn seeded(temperature: f32) -> SamplingParams {
    SamplingParams {
        temperature,
        seed: Some(5),
        ..SamplingParams::default()
    }
}

#[test]
fn greedy_and_sampled_outputs_fit_the_schema_and_end_when_it_accepts() {
    let person = schema(serde_json::json!({
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 6},
            "age": {"type": "integer", "minimum": 0, "maximum": 120},
            "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 2}
        },
        "required": ["name", "age", "tags"],
        "additionalProperties": false
    }));
    for temperature in [0.0, 1.0] {
        let (text, ended) = run(&person, seeded(temperature), 200);
        assert!(ended, "no end token after {text:?}");
        let v: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{text:?}: {e}"));
        assert!(v["name"].as_str().unwrap().chars().count() <= 6, "{text}");
        let age = v["age"].as_i64().unwrap();
        assert!((0..=120).contains(&age), "{text}");
        assert!(v["tags"].as_array().unwrap().len() <= 2, "{text}");
        assert!(text.starts_with("{\"name\": \""), "compact layout: {text}");
    }
}

#[test]
fn without_the_constraint_the_same_logits_give_prose() {
    let mut sampler = Sampler::new(seeded(0.0));
    let vocab = compiler().env.tok_trie().vocab_size();
    let first = sampler.sample(&prose_logits(vocab, 0), &[], 0).unwrap();
    assert_eq!(first.token, u32::from(b'x'));
}

#[test]
fn json_object_allows_any_object_and_nothing_else() {
    let (text, ended) = run(&OutputConstraint::JsonObject, seeded(1.0), 300);
    if ended {
        let v: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{text:?}: {e}"));
        assert!(v.is_object());
    } else {
        assert!(text.starts_with('{'), "{text}");
    }
}

#[test]
fn a_bias_cannot_bring_back_a_forbidden_token_and_the_end_waits_for_acceptance() {
    let compiler = compiler();
    let vocab = compiler.env.tok_trie().vocab_size();
    let end = end_token();
    let params = SamplingParams {
        logit_bias: [(u32::from(b'x'), 100.0), (end, 100.0)].into(),
        ..SamplingParams::default()
    };
    let digits = schema(serde_json::json!({"type": "integer"}));
    let mut sampler = Sampler::new(params).with_grammar(compiler.start(&digits).unwrap());
    let first = sampler.sample(&prose_logits(vocab, 0), &[], 0).unwrap();
    assert!(
        first.token == u32::from(b'-') || (first.token as u8).is_ascii_digit(),
        "{first:?}"
    );
    // The log-probability reported is the model's own, unmasked one.
    let own = crate::sampling::top_logprobs(&prose_logits(vocab, 0), vocab);
    let want = own.iter().find(|t| t.0 == first.token).unwrap().1;
    assert!((first.logprob - want).abs() < 1e-5);
    // One digit written: the integer is complete, so the biased end token now wins.
    let next = sampler
        .sample(&prose_logits(vocab, 1), &[first.token], 1)
        .unwrap();
    if first.token != u32::from(b'-') && first.token != u32::from(b'0') {
        assert_eq!(next.token, end);
    }
}

#[test]
fn a_constrained_sampler_is_never_greedy_on_the_device() {
    let compiler = compiler();
    let g = compiler.start(&OutputConstraint::JsonObject).unwrap();
    assert!(Sampler::new(SamplingParams::default()).is_greedy());
    assert!(!Sampler::new(SamplingParams::default())
        .with_grammar(g)
        .is_greedy());
}

#[test]
fn unsupported_keywords_are_named_and_limits_hold() {
    let compiler = compiler();
    let err = |c: &OutputConstraint| compiler.start(c).unwrap_err().to_string();
    let unique = schema(serde_json::json!({"type": "array", "uniqueItems": true}));
    let e = err(&unique);
    assert!(e.contains("uniqueItems"), "{e}");
    let e = err(&OutputConstraint::JsonSchema {
        schema: "{\"type\": ".into(),
    });
    assert!(e.contains("not valid JSON"), "{e}");
    let huge = OutputConstraint::JsonSchema {
        schema: format!(
            "{{\"type\": \"string\", \"description\": \"{}\"}}",
            "x".repeat(MAX_CONSTRAINT_BYTES)
        ),
    };
    assert!(err(&huge).contains("at most 65536"), "{}", err(&huge));
    let e = err(&OutputConstraint::Lark {
        grammar: "start: foo".into(),
    });
    assert!(e.contains("cannot be enforced"), "{e}");
}

#[test]
fn compiled_grammars_are_cached_and_each_sequence_starts_fresh() {
    let compiler = compiler();
    let c = schema(serde_json::json!({"enum": ["yes", "no"]}));
    let mut first = compiler.start(&c).unwrap();
    first.commit(u32::from(b'"')).unwrap();
    first.commit(u32::from(b'y')).unwrap();
    assert_eq!(compiler.cache.lock().unwrap().len(), 1);
    let mut second = compiler.start(&c).unwrap();
    // The second starts at the beginning: `"n` is allowed there, not after `"y`.
    second.commit(u32::from(b'"')).unwrap();
    second.commit(u32::from(b'n')).unwrap();
    assert!(first.commit(u32::from(b'n')).is_err());
    assert_eq!(compiler.cache.lock().unwrap().len(), 1);
}

#[test]
fn a_forced_call_grammar_embeds_the_tool_schema() {
    let grammar = r#"
start: "get_weather\", \"arguments\": " args "}\n</tool_call>"
args: %json {"type": "object", "properties": {"city": {"type": "string", "maxLength": 5}}, "required": ["city"], "additionalProperties": false, "x-guidance": {"whitespace_flexible": false, "item_separator": ", ", "key_separator": ": "}}
"#;
    let (text, ended) = run(
        &OutputConstraint::Lark {
            grammar: grammar.into(),
        },
        seeded(0.0),
        200,
    );
    assert!(ended, "{text}");
    let args = text
        .strip_prefix("get_weather\", \"arguments\": ")
        .and_then(|t| t.strip_suffix("}\n</tool_call>"))
        .unwrap_or_else(|| panic!("{text}"));
    let v: Value = serde_json::from_str(args).unwrap();
    assert!(v["city"].as_str().unwrap().chars().count() <= 5);
}

#[test]
fn control_rules_become_special_tokens_only_where_the_vocabulary_has_them_as_such() {
    let grammar = "start: args ctl_0 ctl_1\nargs: %json {\"description\": \"ctl_2: \\\"x\\\"\"}\nctl_0: \"<|call|>\"\nctl_1: \"<｜tool▁sep｜>\"\n";
    let resolved = resolve_controls(grammar, |t| (t == "<|call|>").then_some(200_012));
    assert_eq!(
        resolved,
        "start: args ctl_0 ctl_1\nargs: %json {\"description\": \"ctl_2: \\\"x\\\"\"}\nctl_0: <[200012]>\nctl_1: \"<｜tool▁sep｜>\"\n"
    );
    // Lines that only look like control rules are left alone.
    for line in [
        "ctl_: \"a\"\n",
        "ctl_x: \"a\"\n",
        "xctl_0: \"a\"\n",
        "ctl_0: a\n",
    ] {
        assert_eq!(resolve_controls(line, |_| Some(1)), line);
    }
}

#[test]
fn a_forced_calls_text_regex_and_control_rules_compile() {
    // MiniMax M3's string values and a control token left as text (this vocabulary has it
    // only as bytes).
    let c = OutputConstraint::Lark {
        grammar: "start: ctl_0 \"<city>\" /[^<\\]]*/ ctl_0 \"</city>\"\nctl_0: \"]<]m[>[\"\n"
            .into(),
    };
    let mut grammar = compiler().start(&c).unwrap();
    for b in "]<]m[>[<city>Bern]<]m[>[</city>".bytes() {
        grammar.commit(u32::from(b)).unwrap();
    }
    assert!(grammar.accepts());
}

#[test]
fn mistrals_args_form_compiles_and_ends_after_the_arguments() {
    // The `required` rules the gateway writes for `[TOOL_CALLS]NAME[ARGS]{…}`, `[ARGS]` left
    // as text (this vocabulary has it only as bytes): nothing may follow the arguments.
    let c = OutputConstraint::Lark {
        grammar: "start: call_0\ncall_0: \"get_weather\" ctl_0 args_0 \n\
                  args_0: %json {\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\"}}, \"required\": [\"city\"], \"additionalProperties\": false}\n\
                  ctl_0: \"[ARGS]\"\n"
            .into(),
    };
    let mut grammar = compiler().start(&c).unwrap();
    commit_text(&mut grammar, "get_weather[ARGS]{\"city\": \"Bern\"}");
    assert!(grammar.accepts());
    assert!(grammar.commit(u32::from(b'}')).is_err());
}

/// Whether `grammar` allows `token` next (its mask leaves the logit finite).
fn allows(grammar: &mut Grammar, token: u32) -> bool {
    let vocab = compiler().env.tok_trie().vocab_size();
    let mut logits = vec![0.0f32; vocab];
    grammar.mask(&mut logits).unwrap();
    logits[token as usize].is_finite()
}

fn commit_text(grammar: &mut Grammar, text: &str) {
    for b in text.bytes() {
        grammar
            .commit(u32::from(b))
            .unwrap_or_else(|e| panic!("{text:?} at {:?}: {e}", b as char));
    }
}

/// A lazy call grammar as the gateway writes it for one strict tool (`strict` under `auto`).
fn lazy(opener: &str) -> OutputConstraint {
    let grammar = format!(
        "lazy_start: {} \"{{\\\"name\\\": \\\"\" lazy_call\nlazy_call: call_0\n\
         call_0: \"get\\\", \\\"arguments\\\": \" args_0 \"}}\" ctl_0\n\
         args_0: %json {{\"type\": \"object\", \"properties\": {{\"city\": {{\"type\": \"string\", \"maxLength\": 4}}}}, \"required\": [\"city\"], \"additionalProperties\": false}}\n\
         ctl_0: \"<|/tool|>\"\n",
        serde_json::to_string(opener).unwrap()
    );
    OutputConstraint::Lark { grammar }
}

#[test]
fn a_lazy_start_becomes_a_token_or_a_lazy_lexeme_as_the_vocabulary_has_the_marker() {
    let line = "lazy_start: \"<|tool|>\" \"{\" lazy_call\nlazy_call: call_0\n";
    assert_eq!(
        resolve_lazy_start(line, |t| (t == "<|tool|>").then_some(256)),
        "start: lazy_free (<[256]> \"{\" lazy_call lazy_free)*\nlazy_free: <[^256]>*\n\
         lazy_call: call_0\n"
    );
    assert_eq!(
        resolve_lazy_start(line, |_| None),
        "start: (lazy_head \"{\" lazy_call)* lazy_tail\nlazy_head[lazy]: LAZY_TEXT \"<|tool|>\"\n\
         lazy_tail: LAZY_TEXT\nLAZY_TEXT: /(?s:.*)/\nlazy_call: call_0\n"
    );
    // Other grammars pass unchanged.
    for other in ["start: a\n", "lazy_start: nope\n"] {
        assert_eq!(resolve_lazy_start(other, |_| Some(1)), other);
    }
}

#[test]
fn under_a_lazy_grammar_prose_is_free_and_a_call_once_opened_must_fit() {
    let trie_special = |name: &str| compiler().env.tok_trie().get_special_token(name).unwrap();
    let (tool, end_tool, user) = (
        trie_special("<|tool|>"),
        trie_special("<|/tool|>"),
        trie_special("<|user|>"),
    );
    // The marker is a special token: prose (other control tokens too) may end the answer;
    // after the marker only the call's text, under the schema.
    let mut g = compiler().start(&lazy("<|tool|>")).unwrap();
    commit_text(&mut g, "Sunny, I think. ");
    assert!(g.accepts(), "prose alone is an answer");
    assert!(allows(&mut g, user), "another control token is free text");
    g.commit(tool).unwrap();
    assert!(!g.accepts());
    assert!(
        !allows(&mut g, u32::from(b'x')),
        "the call's opening is fixed"
    );
    commit_text(&mut g, "{\"name\": \"get\", \"arguments\": {\"city\": \"");
    commit_text(&mut g, "Bern");
    assert!(
        !allows(&mut g, u32::from(b'e')),
        "maxLength 4 holds inside the call"
    );
    commit_text(&mut g, "\"}}");
    assert!(!allows(&mut g, end_token()), "the call's close is due");
    g.commit(end_tool).unwrap();
    assert!(g.accepts(), "prose or the end may follow a call");
    commit_text(&mut g, " Done.");
    assert!(g.accepts());

    // The marker is text in this vocabulary: the call starts where the text ends with it.
    let mut g = compiler().start(&lazy("<call>")).unwrap();
    commit_text(&mut g, "Let me see <cal");
    assert!(g.accepts(), "text that only begins the marker is prose");
    commit_text(&mut g, "l>");
    assert!(!g.accepts(), "the marker commits to a call");
    assert!(
        !allows(&mut g, u32::from(b' ')),
        "no prose after the marker"
    );
    commit_text(
        &mut g,
        "{\"name\": \"get\", \"arguments\": {\"city\": \"Rome\"}}",
    );
    g.commit(end_tool).unwrap();
    assert!(g.accepts());
}
