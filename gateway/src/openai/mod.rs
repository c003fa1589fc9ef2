//! OpenAI's chat completions API: request parsing, response shapes, stop strings.

pub mod request;
pub mod response;
pub mod stop;
