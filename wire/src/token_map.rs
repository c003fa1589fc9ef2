//! A map from token ids to numbers (`logit_bias`) in JSON: an object keyed by the id written
//! as a string, `{"50256": -100}`, as OpenAI spells it.
//!
//! serde_json writes integer keys as strings and reads them back from a plain struct, but not
//! from inside an internally tagged message (`{"type": "generate", ...}`, the runner
//! protocol's): serde buffers such a message first, and the buffered keys are strings that no
//! longer parse as integers. [`deserialize`] reads the keys as strings and parses them itself,
//! so the map reads the same wherever it travels.

use serde::de::Error;
use serde::{Deserialize, Deserializer};
use std::collections::BTreeMap;

/// Reads `{"ID": number, ...}` into a map from token id to value; a key that is not a
/// non-negative 32-bit integer is an error naming it.
pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<BTreeMap<u32, f32>, D::Error> {
    BTreeMap::<String, f32>::deserialize(d)?
        .into_iter()
        .map(|(key, value)| match key.parse::<u32>() {
            Ok(id) => Ok((id, value)),
            Err(_) => Err(D::Error::custom(format!(
                "token id {key:?} is not a non-negative integer"
            ))),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use serde::{Deserialize, Serialize};
    use std::collections::BTreeMap;

    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    struct Params {
        #[serde(default, deserialize_with = "super::deserialize")]
        bias: BTreeMap<u32, f32>,
    }

    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    #[serde(tag = "type", rename_all = "snake_case")]
    enum Message {
        Generate { params: Params },
    }

    #[test]
    fn token_maps_read_back_inside_tagged_messages_too() {
        let msg = Message::Generate {
            params: Params {
                bias: [(7, 2.5), (50256, -100.0)].into(),
            },
        };
        let json = serde_json::to_string(&msg).unwrap();
        assert_eq!(
            json,
            r#"{"type":"generate","params":{"bias":{"7":2.5,"50256":-100.0}}}"#
        );
        assert_eq!(serde_json::from_str::<Message>(&json).unwrap(), msg);
        let absent: Params = serde_json::from_str("{}").unwrap();
        assert!(absent.bias.is_empty());
        let err =
            serde_json::from_str::<Message>(r#"{"type":"generate","params":{"bias":{"-1":1}}}"#)
                .unwrap_err();
        assert!(err.to_string().contains(r#"token id "-1""#), "{err}");
    }
}
