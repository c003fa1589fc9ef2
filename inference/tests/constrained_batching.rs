//! Constrained decoding on the real SmolLM2 fixture (f32, one process): requests under JSON
//! Schemas and JSON mode, batched beside unconstrained ones and joining at different steps,
//! give the same tokens as alone, and each answer parses and fits its schema; the same
//! prompts without the constraint do not give JSON (so the constraint is what makes them);
//! a schema the engine cannot enforce is refused at submit and the batch runs on.

use inference::batch::{BatchEvent, BatchLimits, Batcher, LocalBatch};
use inference::{ChatMessage, Engine, FinishReason, GenerateRequest, OutputConstraint, Prompt};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::ops::ControlFlow;

mod common;

use common::smollm2_f32 as engine;

fn request(text: &str, constraint: Option<OutputConstraint>) -> GenerateRequest {
    let mut r = GenerateRequest::new(
        Prompt::Chat(vec![
            ChatMessage::new("system", "You answer with JSON."),
            ChatMessage::new("user", text),
        ]),
        96,
    );
    r.constraint = constraint;
    r
}

fn schema(v: Value) -> Option<OutputConstraint> {
    Some(OutputConstraint::JsonSchema {
        schema: v.to_string(),
    })
}

/// (question, constraint, a check of the parsed answer).
type Case = (&'static str, Option<OutputConstraint>, fn(&Value) -> bool);

fn cases() -> Vec<Case> {
    vec![
        (
            "Describe a person.",
            schema(json!({"type": "object", "properties": {
                "name": {"type": "string", "maxLength": 20},
                "age": {"type": "integer", "minimum": 0, "maximum": 120}},
                "required": ["name", "age"], "additionalProperties": false})),
            |v| v["name"].is_string() && (0..=120).contains(&v["age"].as_i64().unwrap_or(-1)),
        ),
        (
            "What colour is the sky?",
            schema(json!({"type": "object", "properties": {
                "color": {"enum": ["red", "green", "blue"]}}, "required": ["color"]})),
            |v| ["red", "green", "blue"].contains(&v["color"].as_str().unwrap_or("")),
        ),
        (
            "List some fruits.",
            schema(
                json!({"type": "object", "properties": {"fruits": {"type": "array",
                "items": {"type": "string", "maxLength": 12}, "minItems": 2, "maxItems": 4}},
                "required": ["fruits"]}),
            ),
            |v| (2..=4).contains(&v["fruits"].as_array().map_or(0, Vec::len)),
        ),
        (
            "Describe a cat.",
            Some(OutputConstraint::JsonObject),
            Value::is_object,
        ),
    ]
}

/// Each request's completion, run by a batcher that admits request `i` at step `joins[i]`.
fn run_batch(
    e: &Engine,
    requests: &[GenerateRequest],
    joins: &[usize],
) -> BTreeMap<u64, (String, FinishReason)> {
    let limits = BatchLimits {
        max_sequences: 8,
        kv_tokens: 8192,
    };
    let forward = LocalBatch::new(&e.model, limits.max_sequences).unwrap();
    let mut b = Batcher::new(Box::new(forward), &e.tokenizer, limits);
    let mut done = BTreeMap::new();
    let mut step = 0;
    while done.len() < requests.len() {
        for (i, r) in requests.iter().enumerate() {
            if joins[i] == step {
                b.submit(i as u64, r).unwrap();
                // A schema the engine cannot enforce is refused here; the others run on.
                let bad = request("x", schema(json!({"type": "array", "uniqueItems": true})));
                let err = b.submit(100 + i as u64, &bad).unwrap_err().to_string();
                assert!(err.contains("uniqueItems"), "{err}");
            }
        }
        for (id, ev) in b.step().unwrap() {
            match ev {
                BatchEvent::Done(c) => {
                    done.insert(id, (c.text, c.finish_reason));
                }
                BatchEvent::Failed { message, .. } => panic!("request {id} failed: {message}"),
                _ => {}
            }
        }
        step += 1;
        assert!(step < 10_000, "the batch never finished");
    }
    assert!(b.is_idle());
    done
}

fn alone(e: &Engine, r: &GenerateRequest) -> String {
    e.generate(r, |_| ControlFlow::Continue(())).unwrap().text
}

#[test]
fn constrained_rows_fit_their_schemas_batched_as_alone() {
    let e = engine();
    let cases = cases();
    let mut requests: Vec<GenerateRequest> = cases
        .iter()
        .map(|(q, c, _)| request(q, c.clone()))
        .collect();
    // Two unconstrained rows share the batch.
    requests.push(request("Say hello.", None));
    requests.push(request("Count to five.", None));
    let solo: Vec<String> = requests.iter().map(|r| alone(&e, r)).collect();
    let batched = run_batch(&e, &requests, &[0, 0, 2, 5, 1, 3]);
    for (i, text) in solo.iter().enumerate() {
        assert_eq!(
            &batched[&(i as u64)].0,
            text,
            "request {i}: batched as alone"
        );
    }
    for (i, (_, _, fits)) in cases.iter().enumerate() {
        let finish = batched[&(i as u64)].1;
        assert_eq!(
            finish,
            FinishReason::Stop,
            "request {i} ended when its JSON did"
        );
        let v: Value = serde_json::from_str(&solo[i])
            .unwrap_or_else(|err| panic!("request {i}: {:?} is not JSON: {err}", solo[i]));
        assert!(fits(&v), "request {i}: {v} does not fit its schema");
    }
    eprintln!("constrained answers: {:?}", &solo[..cases.len()]);
}

#[test]
fn without_the_constraint_the_same_prompts_are_not_json() {
    let e = engine();
    let answers: Vec<String> = cases()
        .iter()
        .map(|(q, _, _)| alone(&e, &request(q, None)))
        .collect();
    let json = answers
        .iter()
        .filter(|a| serde_json::from_str::<Value>(a).is_ok_and(|v| v.is_object()))
        .count();
    eprintln!("unconstrained answers: {answers:?}");
    assert!(
        json * 2 < answers.len(),
        "{json} of {} unconstrained answers were JSON objects already: {answers:?}",
        answers.len()
    );
}
