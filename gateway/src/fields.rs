//! Reading one field of a JSON request body, with a 400 naming the field (`param`) when it
//! has the wrong type or range. Shared by every API's parser, so that each states its
//! limits the same way.

use crate::error::{echo, ApiError, ErrorKind};
use serde_json::{Map, Value};

/// A request body as a JSON object: 400 `invalid_json` when it is not JSON, 400 when it is
/// JSON but not an object.
pub fn json_object(body: &[u8]) -> Result<Map<String, Value>, ApiError> {
    match serde_json::from_slice(body) {
        Ok(Value::Object(obj)) => Ok(obj),
        Ok(_) => Err(ApiError::new(
            ErrorKind::InvalidRequest,
            "the body must be a JSON object",
        )),
        Err(e) => Err(ApiError::new(
            ErrorKind::InvalidRequest,
            format!("the body is not valid JSON: {e}"),
        )
        .with_code("invalid_json")),
    }
}

/// A required non-empty string field (`model`, `model_id`).
pub fn required_string(value: Option<&Value>, name: &str) -> Result<String, ApiError> {
    match value {
        None | Some(Value::Null) => Err(ApiError::missing_field(name)),
        Some(Value::String(s)) if !s.is_empty() => Ok(s.clone()),
        Some(_) => Err(ApiError::invalid_field(
            name,
            format!("`{name}` must be a non-empty string"),
        )),
    }
}

/// A required array field with at least one element (`messages`, `input`).
pub fn non_empty_array<'a>(value: Option<&'a Value>, name: &str) -> Result<&'a [Value], ApiError> {
    match value {
        None | Some(Value::Null) => Err(ApiError::missing_field(name)),
        Some(Value::Array(list)) if !list.is_empty() => Ok(list),
        Some(Value::Array(_)) => Err(ApiError::invalid_field(
            name,
            format!("`{name}` must hold at least one element"),
        )),
        Some(_) => Err(ApiError::invalid_field(
            name,
            format!("`{name}` must be an array"),
        )),
    }
}

/// Most stop strings accepted (OpenAI allows 4; a few more cost nothing).
pub const MAX_STOP_STRINGS: usize = 16;

/// Stop strings from a string or an array of strings (`name` is the field): empty ones
/// dropped, sorted, deduplicated, at most [`MAX_STOP_STRINGS`].
pub fn parse_stop(value: Option<&Value>, name: &str) -> Result<Vec<String>, ApiError> {
    let mut stops = match value {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(items)) => {
            let mut out = Vec::with_capacity(items.len());
            for item in items {
                match item {
                    Value::String(s) => out.push(s.clone()),
                    _ => {
                        return Err(ApiError::invalid_field(
                            name,
                            format!("`{name}` must be a string or an array of strings"),
                        ))
                    }
                }
            }
            out
        }
        Some(_) => {
            return Err(ApiError::invalid_field(
                name,
                format!("`{name}` must be a string or an array of strings"),
            ))
        }
    };
    stops.retain(|s| !s.is_empty());
    stops.sort();
    stops.dedup();
    if stops.len() > MAX_STOP_STRINGS {
        return Err(ApiError::invalid_field(
            name,
            format!("at most {MAX_STOP_STRINGS} stop strings are accepted"),
        ));
    }
    Ok(stops)
}

/// `seed`: any integer (a negative one keeps its bits).
pub fn parse_seed(obj: &Map<String, Value>) -> Result<Option<u64>, ApiError> {
    match obj.get("seed") {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Number(n)) => {
            if let Some(u) = n.as_u64() {
                Ok(Some(u))
            } else if let Some(i) = n.as_i64() {
                // Negative seeds are valid in OpenAI's API; keep their bits.
                Ok(Some(i as u64))
            } else {
                Err(ApiError::invalid_field("seed", "`seed` must be an integer"))
            }
        }
        Some(_) => Err(ApiError::invalid_field("seed", "`seed` must be an integer")),
    }
}

/// An optional boolean.
pub fn opt_bool(obj: &Map<String, Value>, name: &str) -> Result<Option<bool>, ApiError> {
    match obj.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(*b)),
        Some(_) => Err(ApiError::invalid_field(
            name,
            format!("`{name}` must be true or false"),
        )),
    }
}

/// Most alternatives `top_logprobs` may ask for (OpenAI's bound, which every API here keeps).
pub const MAX_TOP_LOGPROBS: u64 = 20;

/// `top_logprobs`: how many alternatives to report per token, at most [`MAX_TOP_LOGPROBS`].
pub fn opt_top_logprobs(obj: &Map<String, Value>) -> Result<Option<u32>, ApiError> {
    let max = MAX_TOP_LOGPROBS;
    match opt_u64(obj, "top_logprobs")? {
        Some(k) if k > max => Err(ApiError::invalid_field(
            "top_logprobs",
            format!("`top_logprobs` must be between 0 and {max}"),
        )),
        k => Ok(k.map(|k| k as u32)),
    }
}

/// An optional non-negative integer (an integral float such as `16.0` is accepted).
pub fn opt_u64(obj: &Map<String, Value>, name: &str) -> Result<Option<u64>, ApiError> {
    match obj.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Number(n)) => match n.as_u64() {
            Some(v) => Ok(Some(v)),
            // Accept integral floats such as 16.0, which some clients send.
            None => match n.as_f64() {
                // `u64::MAX as f64` is 2^64, which does not fit: the bound is exclusive.
                Some(f) if f >= 0.0 && f.fract() == 0.0 && f < u64::MAX as f64 => {
                    Ok(Some(f as u64))
                }
                _ => Err(ApiError::invalid_field(
                    name,
                    format!("`{name}` must be a non-negative integer"),
                )),
            },
        },
        Some(_) => Err(ApiError::invalid_field(
            name,
            format!("`{name}` must be a non-negative integer"),
        )),
    }
}

/// An optional non-negative integer that must fit in 32 bits (token counts, `top_k`): a
/// larger one is a 400 stating the bound, not clamped, so that a client's mistake (2^64
/// `max_tokens`) is not silently answered as something else.
pub fn opt_u32(obj: &Map<String, Value>, name: &str) -> Result<Option<u32>, ApiError> {
    let too_large = |n: &dyn std::fmt::Display| {
        ApiError::invalid_field(
            name,
            format!("`{name}` must be at most {}, not {n}", u32::MAX),
        )
    };
    // Integral floats (16.0) are integers too: anything from 2^32 up is refused, however
    // written (2^64 and 1e300 included, which `opt_u64` would call "not an integer").
    if let Some(Value::Number(n)) = obj.get(name) {
        if n.as_f64()
            .is_some_and(|f| f.fract() == 0.0 && f > f64::from(u32::MAX))
        {
            return Err(too_large(n));
        }
    }
    match opt_u64(obj, name)? {
        Some(v) => u32::try_from(v).map(Some).map_err(|_| too_large(&v)),
        None => Ok(None),
    }
}

/// A bound on the tokens to generate (`max_tokens`, `max_completion_tokens`,
/// `max_output_tokens`): at least 1 and at most `u32::MAX` ([`opt_u32`]).
pub fn opt_max_tokens(obj: &Map<String, Value>, name: &str) -> Result<Option<u32>, ApiError> {
    match opt_u32(obj, name)? {
        Some(0) => Err(ApiError::invalid_field(
            name,
            format!("`{name}` must be at least 1"),
        )),
        n => Ok(n),
    }
}

/// An optional number within `min..=max`.
pub fn opt_f32_in(
    obj: &Map<String, Value>,
    name: &str,
    min: f64,
    max: f64,
) -> Result<Option<f32>, ApiError> {
    let bad = || {
        ApiError::invalid_field(
            name,
            format!("`{name}` must be a number between {min} and {max}"),
        )
    };
    match obj.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Number(n)) => match n.as_f64() {
            Some(f) if (min..=max).contains(&f) => Ok(Some(f as f32)),
            _ => Err(bad()),
        },
        Some(_) => Err(bad()),
    }
}

/// Most tokens `logit_bias` may name (OpenAI's bound).
pub const MAX_LOGIT_BIAS: usize = 300;
/// Largest bias magnitude `logit_bias` accepts (OpenAI's range, -100 to 100).
pub const MAX_BIAS: f64 = 100.0;

/// `logit_bias` (`name` is the field): an object from token ids, written as strings of a
/// non-negative integer (`"50256"`), to a bias in [-100, 100]; at most [`MAX_LOGIT_BIAS`]
/// tokens. Whether the ids are in the model's vocabulary is checked where the model runs.
pub fn parse_logit_bias(
    value: Option<&Value>,
    name: &str,
) -> Result<std::collections::BTreeMap<u32, f32>, ApiError> {
    let map = match value {
        None | Some(Value::Null) => return Ok(Default::default()),
        Some(Value::Object(map)) => map,
        Some(_) => {
            return Err(ApiError::invalid_field(
                name,
                format!(
                "`{name}` must be an object from token ids to biases, such as {{\"50256\": -100}}"
            ),
            ))
        }
    };
    if map.len() > MAX_LOGIT_BIAS {
        return Err(ApiError::invalid_field(
            name,
            format!(
                "`{name}` may name at most {MAX_LOGIT_BIAS} tokens, not {}",
                map.len()
            ),
        ));
    }
    let mut out = std::collections::BTreeMap::new();
    for (key, bias) in map {
        let Ok(token) = key.parse::<u32>() else {
            return Err(ApiError::invalid_field(
                name,
                format!(
                    "`{name}` keys must be token ids (non-negative integers such as \"50256\"), not {:?}",
                    echo(key)
                ),
            ));
        };
        match bias.as_f64() {
            Some(b) if (-MAX_BIAS..=MAX_BIAS).contains(&b) => {
                out.insert(token, b as f32);
            }
            _ => {
                return Err(ApiError::invalid_field(
                    name,
                    format!(
                        "`{name}` of token {key} must be a number between -{MAX_BIAS} and {MAX_BIAS}, not {}",
                        echo(&bias.to_string())
                    ),
                ))
            }
        }
    }
    Ok(out)
}

/// A reasoning effort (OpenAI's `reasoning_effort`, Responses' `reasoning.effort`, Ollama's
/// `think` level): one of the known words, since the template prints it into the prompt as
/// it is (gpt-oss's `Reasoning: high`).
pub fn reasoning_effort(value: Option<&Value>, name: &str) -> Result<Option<String>, ApiError> {
    match value {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) if matches!(s.as_str(), "minimal" | "low" | "medium" | "high") => {
            Ok(Some(s.clone()))
        }
        Some(_) => Err(ApiError::invalid_field(
            name,
            format!("`{name}` must be \"minimal\", \"low\", \"medium\" or \"high\""),
        )),
    }
}
