//! A chat's messages: as the gateway parses them out of every API, as a forwarded chat carries
//! them between nodes, and as the chat template renders them on the node that runs the model.
//! One type for all three, so that nothing is lost or renamed between the API and the prompt.

use serde::{Deserialize, Serialize};

/// One message of the conversation, its content flattened to text, with the images it carries,
/// the tool calls an assistant turn made and, for a `tool` turn, the call it answers. The image
/// and tool fields are left out of the JSON when empty (a forwarded chat's bytes stay those of
/// peers without them).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChatMessage {
    /// `system`, `developer`, `user`, `assistant` or `tool`.
    pub role: String,
    /// The text (empty for an assistant turn that only called tools).
    pub content: String,
    /// The images the message carries, in the order sent. A chat template shows them before
    /// the message's text (as mlx-vlm renders a message with images), since the APIs' parts are
    /// flattened into one text.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub images: Vec<ChatImage>,
    /// The calls an assistant turn made; templates see each as
    /// `{"id", "type": "function", "function": {"name", "arguments": {...}}}`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCall>,
    /// A tool result's call id (`role: "tool"`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    /// A tool result's tool name (`role: "tool"`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

impl ChatMessage {
    /// A message with this role and text.
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> ChatMessage {
        ChatMessage {
            role: role.into(),
            content: content.into(),
            ..ChatMessage::default()
        }
    }
}

/// A call: made by an earlier assistant turn (sent back by the client), or parsed out of an
/// answer.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolCall {
    /// The call's id, which the tool result names.
    pub id: String,
    /// The function called.
    pub name: String,
    /// The arguments as JSON text of an object, keys in the order written; templates see it
    /// parsed, as `transformers` passes it (text that is not JSON is passed as the string).
    pub arguments: String,
}

/// An image a message carries: the encoded file the client sent (PNG, JPEG, WebP or GIF),
/// already checked by the gateway (it decodes, within its limits), with the size it found.
/// The encoded bytes travel rather than pixels: they are far smaller, and the node that runs
/// the model's vision tower decodes them again.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChatImage {
    /// The encoded file; base64 text in JSON.
    #[serde(with = "base64_bytes")]
    pub data: Vec<u8>,
    /// Width in pixels.
    pub width: u32,
    /// Height in pixels.
    pub height: u32,
}

/// Serde for bytes as standard base64 text (JSON arrays of numbers would be four times larger).
mod base64_bytes {
    use base64::Engine;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(bytes: &[u8], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&base64::engine::general_purpose::STANDARD.encode(bytes))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        let text = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        base64::engine::general_purpose::STANDARD
            .decode(text.as_bytes())
            .map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_image_travels_as_base64_and_comes_back_equal() {
        let message = ChatMessage {
            images: vec![ChatImage {
                data: vec![0, 1, 2, 254, 255],
                width: 3,
                height: 2,
            }],
            ..ChatMessage::new("user", "what is this?")
        };
        let json = serde_json::to_value(&message).unwrap();
        assert_eq!(json["images"][0]["data"], "AAEC/v8=");
        let back: ChatMessage = serde_json::from_value(json).unwrap();
        assert_eq!(back, message);
        // Without images the field is absent: a text chat's bytes are unchanged.
        let text = serde_json::to_string(&ChatMessage::new("user", "hi")).unwrap();
        assert_eq!(text, r#"{"role":"user","content":"hi"}"#);
        let bad = r#"{"role":"user","content":"","images":[{"data":"%%%","width":1,"height":1}]}"#;
        assert!(serde_json::from_str::<ChatMessage>(bad).is_err());
    }
}
