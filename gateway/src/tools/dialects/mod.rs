//! The dialects whose calls sit in marked blocks, one file each: each is a
//! [`crate::tools::block::Grammar`] run by [`crate::tools::block::BlockParser`]. Harmony
//! (gpt-oss), whose channels carry reasoning as well as calls, has its own parser
//! ([`crate::tools::harmony`]).

pub mod deepseek;
pub mod glm;
pub mod kimi;
pub mod minimax;
pub mod qwen3_coder;
