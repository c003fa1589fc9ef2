//! A chat's messages: as the gateway parses them out of every API, as a forwarded chat carries
//! them between nodes, and as the chat template renders them on the node that runs the model.
//! One type for all three, so that nothing is lost or renamed between the API and the prompt.

use serde::{Deserialize, Serialize};

/// One message of the conversation, its content flattened to text, with the tool calls an
/// assistant turn made and, for a `tool` turn, the call it answers. The tool fields are left
/// out of the JSON when empty (a forwarded chat's bytes stay those of peers without them).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChatMessage {
    /// `system`, `developer`, `user`, `assistant` or `tool`.
    pub role: String,
    /// The text (empty for an assistant turn that only called tools).
    pub content: String,
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
