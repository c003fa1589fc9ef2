//! OpenAI's Responses API, `POST /v1/responses` (whole or streamed), stateless: translated
//! into the gateway's chat request so that it reaches the same instances, through the same
//! forwarding, as chat completions. Errors are in OpenAI's shape, as chat completions'.

pub mod request;
pub mod response;

use crate::backend::Backend;
use crate::body::{json_response, GatewayBody};
use crate::error::ApiError;
use crate::generation::{accept, Ctx};
use hyper::{Response, StatusCode};
use request::{parse_responses_request, ParsedResponses};
use response::{output_items, response_json, ResponseMeta, ResponsesEncoder};
use tokio::time::Instant;

/// `POST /v1/responses`.
pub async fn responses(
    backend: &dyn Backend,
    body: &[u8],
    ctx: &Ctx,
) -> Result<Response<GatewayBody>, ApiError> {
    let received = Instant::now();
    let ParsedResponses {
        request,
        stream,
        instructions,
        max_output_tokens,
    } = parse_responses_request(body)?;
    let mut meta = ResponseMeta::new(&request.model);
    meta.instructions = instructions;
    meta.max_output_tokens = max_output_tokens;
    meta.temperature = request.sampling.temperature;
    meta.top_p = request.sampling.top_p;
    let accepted = accept(backend, request, ctx, received, Some(&meta.id)).await?;
    if stream {
        return Ok(accepted.stream(ResponsesEncoder::new(meta)));
    }
    let answer = accepted.collect().await?;
    Ok(json_response(
        StatusCode::OK,
        &response_json(
            &meta,
            &output_items(
                &meta,
                (&answer.text, &answer.reasoning),
                &answer.tool_calls,
                &answer.logprobs,
                &answer.ending,
            ),
            Some(&answer.ending),
        ),
    ))
}
