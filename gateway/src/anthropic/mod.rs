//! Anthropic's Messages API: `POST /v1/messages` (whole or streamed) and
//! `POST /v1/messages/count_tokens`, translated into the gateway's chat request so that they
//! reach the same instances, through the same forwarding, as chat completions.

pub mod request;
pub mod response;

use crate::backend::Backend;
use crate::body::{json_response, GatewayBody};
use crate::error::ApiError;
use crate::generation::{accept, Ctx};
use hyper::{Response, StatusCode};
use request::{parse_messages_request, ParsedMessages};
use response::{message_id, message_json, MessagesEncoder};
use serde_json::json;
use tokio::time::Instant;

pub use response::error_json;

/// `POST /v1/messages`.
pub async fn messages(
    backend: &dyn Backend,
    body: &[u8],
    ctx: &Ctx,
) -> Result<Response<GatewayBody>, ApiError> {
    let received = Instant::now();
    let ParsedMessages { request, stream } = parse_messages_request(body, false)?;
    let id = message_id();
    let model = request.model.clone();
    let accepted = accept(backend, request, ctx, received, Some(&id)).await?;
    if stream {
        return Ok(accepted.stream(MessagesEncoder::new(id, model)));
    }
    let answer = accepted.collect().await?;
    Ok(json_response(
        StatusCode::OK,
        &message_json(
            &id,
            &model,
            (&answer.text, &answer.reasoning),
            &answer.tool_calls,
            &answer.ending,
        ),
    ))
}

/// `POST /v1/messages/count_tokens`: the prompt's size as the instance counts it. The request
/// is accepted by the instance (which renders and tokenizes it, wherever it runs) and
/// abandoned before it generates, so the count is exactly `usage.input_tokens` of the same
/// message.
pub async fn count_tokens(
    backend: &dyn Backend,
    body: &[u8],
    ctx: &Ctx,
) -> Result<Response<GatewayBody>, ApiError> {
    let ParsedMessages { mut request, .. } = parse_messages_request(body, true)?;
    request.sampling.max_tokens = Some(1);
    let accepted = accept(backend, request, ctx, Instant::now(), None).await?;
    let input_tokens = accepted.prompt_tokens();
    accepted.abandon();
    Ok(json_response(
        StatusCode::OK,
        &json!({ "input_tokens": input_tokens }),
    ))
}
