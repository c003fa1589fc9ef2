//! JSON that keeps the order of object keys as written. `serde_json::Value` sorts keys unless
//! serde_json's `preserve_order` is on (llguidance turns it on in every build that includes
//! `inference`; this type keeps the order whichever build it is in), and a tool's
//! schema and a call's arguments reach the model's prompt as JSON text, and the model should
//! read them as the client wrote them (as `transformers` would, from a Python dict).

use serde::de::{Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use serde::ser::{Serialize, SerializeMap, SerializeSeq, Serializer};
use std::collections::HashMap;
use std::fmt;

/// A JSON value whose objects keep their keys in order.
#[derive(Debug, Clone, PartialEq)]
pub enum Ordered {
    Null,
    Bool(bool),
    Number(serde_json::Number),
    String(String),
    Array(Vec<Ordered>),
    /// Keys in the order written (a repeated key keeps its last value, as in JSON parsers).
    Object(Vec<(String, Ordered)>),
}

impl Ordered {
    /// Parses JSON text; `None` if it is not JSON.
    pub fn parse(text: &[u8]) -> Option<Ordered> {
        serde_json::from_slice(text).ok()
    }

    /// The value at `key` of an object.
    pub fn get(&self, key: &str) -> Option<&Ordered> {
        match self {
            Ordered::Object(entries) => {
                entries.iter().rev().find(|(k, _)| k == key).map(|(_, v)| v)
            }
            _ => None,
        }
    }

    /// The item at `index` of an array.
    pub fn at(&self, index: usize) -> Option<&Ordered> {
        match self {
            Ordered::Array(items) => items.get(index),
            _ => None,
        }
    }

    /// The string, if this is one.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Ordered::String(s) => Some(s),
            _ => None,
        }
    }

    /// Compact JSON text, keys in order.
    pub fn to_text(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }
}

impl Serialize for Ordered {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Ordered::Null => s.serialize_unit(),
            Ordered::Bool(b) => s.serialize_bool(*b),
            Ordered::Number(n) => n.serialize(s),
            Ordered::String(t) => s.serialize_str(t),
            Ordered::Array(items) => {
                let mut seq = s.serialize_seq(Some(items.len()))?;
                for item in items {
                    seq.serialize_element(item)?;
                }
                seq.end()
            }
            Ordered::Object(entries) => {
                let mut map = s.serialize_map(Some(entries.len()))?;
                for (k, v) in entries {
                    map.serialize_entry(k, v)?;
                }
                map.end()
            }
        }
    }
}

impl<'de> Deserialize<'de> for Ordered {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Ordered, D::Error> {
        d.deserialize_any(OrderedVisitor)
    }
}

struct OrderedVisitor;

impl<'de> Visitor<'de> for OrderedVisitor {
    type Value = Ordered;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("JSON")
    }
    fn visit_unit<E>(self) -> Result<Ordered, E> {
        Ok(Ordered::Null)
    }
    fn visit_none<E>(self) -> Result<Ordered, E> {
        Ok(Ordered::Null)
    }
    fn visit_bool<E>(self, b: bool) -> Result<Ordered, E> {
        Ok(Ordered::Bool(b))
    }
    fn visit_i64<E>(self, n: i64) -> Result<Ordered, E> {
        Ok(Ordered::Number(n.into()))
    }
    fn visit_u64<E>(self, n: u64) -> Result<Ordered, E> {
        Ok(Ordered::Number(n.into()))
    }
    fn visit_f64<E>(self, n: f64) -> Result<Ordered, E> {
        Ok(serde_json::Number::from_f64(n).map_or(Ordered::Null, Ordered::Number))
    }
    fn visit_str<E>(self, s: &str) -> Result<Ordered, E> {
        Ok(Ordered::String(s.to_string()))
    }
    fn visit_string<E>(self, s: String) -> Result<Ordered, E> {
        Ok(Ordered::String(s))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Ordered, A::Error> {
        let mut items = Vec::new();
        while let Some(item) = seq.next_element()? {
            items.push(item);
        }
        Ok(Ordered::Array(items))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Ordered, A::Error> {
        // A repeated key is found through an index of the keys seen, not by scanning the
        // entries: a scan made one object of n keys cost n²/2 comparisons (100,000 keys held a
        // serving thread for 14 s).
        let mut entries: Vec<(String, Ordered)> = Vec::new();
        let mut index: HashMap<String, usize> = HashMap::new();
        while let Some((k, v)) = map.next_entry::<String, Ordered>()? {
            match index.get(&k) {
                Some(&at) => entries[at].1 = v,
                None => {
                    index.insert(k.clone(), entries.len());
                    entries.push((k, v));
                }
            }
        }
        Ok(Ordered::Object(entries))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_keep_their_order() {
        let text = r#"{"z": 1, "a": {"y": [true, null, 1.5, "s"], "b": -2}, "z": 3}"#;
        let v = Ordered::parse(text.as_bytes()).unwrap();
        assert_eq!(
            v.to_text(),
            r#"{"z":3,"a":{"y":[true,null,1.5,"s"],"b":-2}}"#
        );
        assert_eq!(
            v.get("a")
                .and_then(|a| a.get("y"))
                .and_then(|y| y.at(3))
                .and_then(Ordered::as_str),
            Some("s")
        );
        assert!(Ordered::parse(b"{\"a\": ").is_none());
    }

    /// One object of many keys parses in time linear in its keys (the repeated-key scan was
    /// quadratic: 100,000 keys took 14 s), and a repeated key still keeps its last value in its
    /// first place.
    #[test]
    fn many_keys_parse_in_linear_time() {
        let keys = 200_000;
        let mut text = String::from("{");
        for i in 0..keys {
            text.push_str(&format!("\"k{i}\":{i},"));
        }
        text.push_str("\"k7\":\"last\"}");
        let started = std::time::Instant::now();
        let v = Ordered::parse(text.as_bytes()).unwrap();
        let took = started.elapsed();
        let Ordered::Object(entries) = &v else {
            panic!("an object")
        };
        assert_eq!(entries.len(), keys);
        assert_eq!(
            entries[7],
            ("k7".to_owned(), Ordered::String("last".into()))
        );
        assert_eq!(v.get("k199999"), Some(&Ordered::Number(199_999.into())));
        // Linear: ~0.1 s in a debug build on 2 cores; the quadratic scan took minutes.
        assert!(took.as_secs_f64() < 5.0, "200,000 keys took {took:?}");
    }
}
