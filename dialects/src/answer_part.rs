//! [`AnswerPart`]: one part of an answer as it streams (reasoning, text, a whole call, or a
//! step of a call whose arguments stream). Its own file because both the answer's splitter
//! ([`crate::answer`]) and the dialect parsers that split whole answers themselves (harmony,
//! [`crate::tools::harmony`]) produce it.

use crate::tools::stream::CallDelta;
use crate::tools::ToolCall;

/// One part of an answer.
#[derive(Debug, Clone, PartialEq)]
pub enum AnswerPart {
    Reasoning(String),
    Text(String),
    /// A whole call.
    Call(ToolCall),
    /// A step of a call that streams its arguments ([`crate::tools::stream`]).
    Stream(CallDelta),
}
