//! Ollama's API, at `/api/*` on the same port (so `ollama.Client(host=...)` and apps set to
//! an Ollama URL work unchanged) and at exo's `/ollama/api/*`: `chat` and `generate` (NDJSON
//! streams by default, or whole answers), `tags`, `show`, `ps` and `version`. Chats become the
//! gateway's chat request and reach the same instances, through the same forwarding, as
//! chat completions.

pub mod request;
pub mod response;

use crate::backend::{Backend, ModelInfo};
use crate::body::{json_response, GatewayBody};
use crate::error::{echo, ApiError, ErrorKind};
use crate::generation::{accept, Ctx};
use hyper::{Response, StatusCode};
use request::{model_name, parse_ollama_request, Endpoint, ParsedOllama};
use response::{answer_json, load_json, with_logprobs, NdjsonEncoder, Shape};
use serde_json::json;
use tokio::time::Instant;

pub use response::{error_json, OLLAMA_API_VERSION};

/// `POST /api/chat` and `POST /api/generate`.
pub async fn generate(
    backend: &dyn Backend,
    body: &[u8],
    ctx: &Ctx,
    endpoint: Endpoint,
) -> Result<Response<GatewayBody>, ApiError> {
    let received = Instant::now();
    let ParsedOllama {
        request,
        stream,
        model,
        load_only,
    } = parse_ollama_request(body, endpoint)?;
    if load_only {
        // Ollama's "load the model": loaded means an instance can answer now; a model the
        // cluster knows but runs nowhere is not loaded, and saying so beats a false `load`.
        let info = find_model(backend, &model).await?;
        if !info.ready {
            return Err(ApiError::no_instance(&info.id));
        }
        return Ok(json_response(StatusCode::OK, &load_json(&model)));
    }
    let shape = match endpoint {
        Endpoint::Chat => Shape::Chat,
        Endpoint::Generate => Shape::Generate,
    };
    let logprobs = request.sampling.logprobs.is_some();
    let accepted = accept(backend, request, ctx, received, None).await?;
    if stream {
        return Ok(accepted.stream(NdjsonEncoder::new(shape, model)));
    }
    let answer = accepted.collect().await?;
    let mut value = answer_json(
        shape,
        &model,
        (&answer.text, &answer.reasoning),
        &answer.tool_calls,
        Some((&answer.ending, &answer.timings)),
    );
    if logprobs {
        value = with_logprobs(value, &answer.logprobs);
    }
    Ok(json_response(StatusCode::OK, &value))
}

/// `GET /api/tags`.
pub async fn tags(backend: &dyn Backend) -> Response<GatewayBody> {
    json_response(
        StatusCode::OK,
        &response::tags_json(&backend.models().await),
    )
}

/// `GET /api/ps`.
pub async fn ps(backend: &dyn Backend) -> Response<GatewayBody> {
    json_response(StatusCode::OK, &response::ps_json(&backend.models().await))
}

/// `GET /api/version`.
pub fn version() -> Response<GatewayBody> {
    json_response(StatusCode::OK, &json!({ "version": OLLAMA_API_VERSION }))
}

/// `POST /api/show`.
pub async fn show(backend: &dyn Backend, body: &[u8]) -> Result<Response<GatewayBody>, ApiError> {
    let obj = crate::fields::json_object(body)?;
    let model = request::required_model(&obj)?;
    let info = find_model(backend, &model).await?;
    Ok(json_response(StatusCode::OK, &response::show_json(&info)))
}

/// The model an Ollama name means, or Ollama's 404.
async fn find_model(backend: &dyn Backend, name: &str) -> Result<ModelInfo, ApiError> {
    let id = model_name(name);
    backend
        .models()
        .await
        .into_iter()
        .find(|m| m.id == id)
        .ok_or_else(|| {
            ApiError::new(
                ErrorKind::NotFound,
                format!("model '{}' not found", echo(name)),
            )
            .with_param("model")
            .with_code("model_not_found")
        })
}
