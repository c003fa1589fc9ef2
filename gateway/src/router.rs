//! Routing: method and path to handler, the access rules checked first (web page origins, then
//! API keys, see [`crate::access`]), request bodies read under the size limit, the shared body
//! budget and the body timeout, and errors turned into each API's own shape.

use crate::access::{AccessPolicy, Scope};
use crate::backend::Backend;
use crate::body::{json_response, GatewayBody};
use crate::cancel::Running;
use crate::chat::chat_completions;
use crate::cluster;
use crate::config::GatewayConfig;
use crate::error::{echo, ApiError, ErrorKind};
use crate::generation::Ctx;
use crate::openai::response::models_json;
use crate::request_body::{read_body, BODY_BUDGET_CODE};
use hyper::body::Body;
use hyper::header::{HeaderValue, ALLOW, CONNECTION, RETRY_AFTER, VARY, WWW_AUTHENTICATE};
use hyper::{Method, Request, Response, StatusCode};
use serde_json::Value;
use std::sync::Arc;
use tokio::sync::Semaphore;

/// The gateway's request handler: cheap to clone, one per server.
#[derive(Clone)]
pub struct Router {
    backend: Arc<dyn Backend>,
    ctx: Ctx,
    events: crate::events::Events,
    access: Arc<AccessPolicy>,
    /// The body budget in KiB permits, shared by every request being read.
    bodies: Arc<Semaphore>,
}

/// The routes, for matching and for `405 Allow` answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Route {
    ChatCompletions,
    Messages,
    CountTokens,
    Responses,
    Cancel,
    OllamaChat,
    OllamaGenerate,
    OllamaShow,
    OllamaTags,
    OllamaPs,
    OllamaVersion,
    Models,
    NodeId,
    State,
    StatePath,
    PlaceInstance,
    CreateInstance,
    InstancePreviews,
    Instance,
    /// `DELETE /models/{model_id}`: this node's downloaded copy of a model.
    Model,
    /// The dashboard's page and files (`/`, `/dashboard/{file}`).
    Dashboard,
    /// The dashboard's state stream.
    Events,
}

impl Route {
    fn find(path: &str) -> Option<(Route, &str)> {
        // exo serves Ollama's API under /ollama; Ollama itself at the root.
        let ollama = path.strip_prefix("/ollama").unwrap_or(path);
        let route = match ollama {
            "/api/chat" => Some(Route::OllamaChat),
            "/api/generate" => Some(Route::OllamaGenerate),
            "/api/show" => Some(Route::OllamaShow),
            "/api/tags" => Some(Route::OllamaTags),
            "/api/ps" => Some(Route::OllamaPs),
            "/api/version" => Some(Route::OllamaVersion),
            _ => None,
        };
        if let Some(route) = route {
            return Some((route, ""));
        }
        let route = match path {
            "/v1/chat/completions" => Route::ChatCompletions,
            "/v1/messages" => Route::Messages,
            "/v1/messages/count_tokens" => Route::CountTokens,
            "/v1/responses" => Route::Responses,
            "/v1/models" | "/models" => Route::Models,
            "/node_id" => Route::NodeId,
            "/state" | "/state/" => Route::State,
            "/place_instance" => Route::PlaceInstance,
            "/instance" => Route::CreateInstance,
            "/instance/previews" => Route::InstancePreviews,
            "/" => return Some((Route::Dashboard, "index.html")),
            "/events" => Route::Events,
            _ => {
                if let Some(file) = path.strip_prefix("/dashboard/") {
                    return Some((Route::Dashboard, file));
                }
                if let Some(id) = path.strip_prefix("/v1/cancel/") {
                    if !id.is_empty() && !id.contains('/') {
                        return Some((Route::Cancel, id));
                    }
                }
                if let Some(id) = path.strip_prefix("/models/") {
                    if !id.is_empty() {
                        return Some((Route::Model, id));
                    }
                }
                if let Some(rest) = path.strip_prefix("/state/") {
                    return Some((Route::StatePath, rest));
                }
                if let Some(id) = path.strip_prefix("/instance/") {
                    if !id.is_empty() && !id.contains('/') {
                        return Some((Route::Instance, id));
                    }
                }
                return None;
            }
        };
        Some((route, ""))
    }

    /// What the route needs of the request's key (see [`crate::access`]).
    fn scope(self) -> Scope {
        match self {
            Route::NodeId | Route::Dashboard => Scope::Public,
            Route::ChatCompletions
            | Route::Messages
            | Route::CountTokens
            | Route::Responses
            | Route::Cancel
            | Route::OllamaChat
            | Route::OllamaGenerate
            | Route::OllamaShow
            | Route::OllamaTags
            | Route::OllamaPs
            | Route::OllamaVersion
            | Route::Models => Scope::Chat,
            Route::State
            | Route::StatePath
            | Route::PlaceInstance
            | Route::CreateInstance
            | Route::InstancePreviews
            | Route::Instance
            | Route::Model
            | Route::Events => Scope::Admin,
        }
    }

    fn methods(self) -> &'static str {
        match self {
            Route::ChatCompletions
            | Route::Messages
            | Route::CountTokens
            | Route::Responses
            | Route::Cancel
            | Route::OllamaChat
            | Route::OllamaGenerate
            | Route::OllamaShow
            | Route::PlaceInstance
            | Route::CreateInstance => "POST, OPTIONS",
            Route::Instance => "GET, HEAD, DELETE, OPTIONS",
            Route::Model => "DELETE, OPTIONS",
            _ => "GET, HEAD, OPTIONS",
        }
    }

    /// The API whose error shape this route answers in.
    fn api(self) -> Api {
        match self {
            Route::Messages | Route::CountTokens => Api::Anthropic,
            Route::OllamaChat
            | Route::OllamaGenerate
            | Route::OllamaShow
            | Route::OllamaTags
            | Route::OllamaPs
            | Route::OllamaVersion => Api::Ollama,
            _ => Api::OpenAi,
        }
    }
}

/// Whose error shape an answer takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Api {
    OpenAi,
    Anthropic,
    Ollama,
}

impl Api {
    fn error_json(self, e: &ApiError) -> Value {
        match self {
            Api::OpenAi => e.to_json(),
            Api::Anthropic => crate::anthropic::error_json(e),
            Api::Ollama => crate::ollama::error_json(e),
        }
    }
}

impl Router {
    /// A router over `backend`, open to every client (no keys) and to the node's own pages.
    pub fn new(backend: Arc<dyn Backend>, config: GatewayConfig) -> Router {
        Router::with_access(backend, config, AccessPolicy::default())
    }

    /// A router over `backend` that enforces `access`.
    pub fn with_access(
        backend: Arc<dyn Backend>,
        config: GatewayConfig,
        access: AccessPolicy,
    ) -> Router {
        Router {
            events: crate::events::Events::new(backend.clone(), config.events),
            access: Arc::new(access),
            bodies: Arc::new(Semaphore::new(config.body_budget.div_ceil(1024))),
            backend,
            ctx: Ctx {
                config,
                running: Running::default(),
                drain: Default::default(),
                caller: Default::default(),
            },
        }
    }

    /// The server's stop, which [`crate::server`] drains when the node stops.
    pub fn drain(&self) -> &crate::drain::Drain {
        &self.ctx.drain
    }

    /// Answers one request. Never fails: every error becomes an error response.
    pub async fn handle<B>(&self, request: Request<B>) -> Response<GatewayBody>
    where
        B: Body + Send,
        B::Data: Send,
        B::Error: std::error::Error + Send + Sync + 'static,
    {
        let route = Route::find(request.uri().path()).map(|(route, _)| route);
        let allow = route.map(Route::methods);
        let path_str = request.uri().path();
        let api = match route {
            Some(route) => route.api(),
            // Ollama's other endpoints (pull, delete, embed, ...) answer in its shape too.
            None if path_str.starts_with("/api/") || path_str.starts_with("/ollama/api/") => {
                Api::Ollama
            }
            None => Api::OpenAi,
        };
        let (method, path) = (request.method().clone(), request.uri().path().to_string());
        // HEAD answers as GET would, without the body.
        let head = method == Method::HEAD;
        let request = if head {
            let (mut parts, body) = request.into_parts();
            parts.method = Method::GET;
            Request::from_parts(parts, body)
        } else {
            request
        };
        let checked = self.access.check_origin(request.headers());
        let allow_origin = checked.as_ref().ok().cloned().flatten();
        let result = match checked {
            Ok(_) => self.dispatch(request).await,
            Err(e) => Err(e),
        };
        let mut response = match result {
            Ok(response) => response,
            Err(e) => {
                if e.kind == ErrorKind::Internal {
                    tracing::error!(error = %e, "request failed");
                }
                let mut r = json_response(e.status(), &api.error_json(&e));
                if let Some(seconds) = e.retry_after_seconds() {
                    r.headers_mut()
                        .insert(RETRY_AFTER, HeaderValue::from(seconds));
                }
                if let (ErrorKind::MethodNotAllowed, Some(allow)) = (e.kind, allow) {
                    r.headers_mut()
                        .insert(ALLOW, HeaderValue::from_static(allow));
                }
                if e.kind == ErrorKind::Unauthorized {
                    r.headers_mut().insert(
                        WWW_AUTHENTICATE,
                        HeaderValue::from_static("Bearer realm=\"shoal\""),
                    );
                }
                // A body left unread (too large, too slow, over budget): end the
                // connection rather than read on.
                if matches!(
                    e.kind,
                    ErrorKind::RequestTimeout | ErrorKind::PayloadTooLarge
                ) || e.code.as_deref() == Some(BODY_BUDGET_CODE)
                {
                    r.headers_mut()
                        .insert(CONNECTION, HeaderValue::from_static("close"));
                }
                r
            }
        };
        if let Some(origin) = allow_origin {
            let h = response.headers_mut();
            h.insert("access-control-allow-origin", origin);
            h.insert(VARY, HeaderValue::from_static("Origin"));
        }
        if head {
            let (parts, _) = response.into_parts();
            response = Response::from_parts(parts, GatewayBody::empty());
        }
        tracing::debug!(%method, %path, status = response.status().as_u16(), "answered");
        response
    }

    async fn dispatch<B>(&self, request: Request<B>) -> Result<Response<GatewayBody>, ApiError>
    where
        B: Body + Send,
        B::Data: Send,
        B::Error: std::error::Error + Send + Sync + 'static,
    {
        let (parts, body) = request.into_parts();
        let path = parts.uri.path();
        let query = parts.uri.query();
        let Some((route, rest)) = Route::find(path) else {
            return Err(ApiError::new(
                ErrorKind::NotFound,
                format!(
                    "no route for {} {}; see the README for the API's routes",
                    echo(parts.method.as_str()),
                    echo(path)
                ),
            )
            .with_code("unknown_route"));
        };
        let method = &parts.method;
        if method == Method::OPTIONS {
            let mut r = Response::new(GatewayBody::empty());
            *r.status_mut() = StatusCode::NO_CONTENT;
            let h = r.headers_mut();
            h.insert(
                "access-control-allow-methods",
                HeaderValue::from_static(route.methods()),
            );
            let requested = parts
                .headers
                .get("access-control-request-headers")
                .cloned()
                .unwrap_or_else(|| HeaderValue::from_static("*"));
            h.insert("access-control-allow-headers", requested);
            h.insert("access-control-max-age", HeaderValue::from_static("86400"));
            return Ok(r);
        }
        // The key travels in the query only for the event stream (EventSource sends no
        // headers); elsewhere a key in a URL would end up in logs and histories.
        let key_query = if route == Route::Events { query } else { None };
        let caller = self
            .access
            .authorize(route.scope(), &parts.headers, key_query)?;
        let backend = self.backend.as_ref();
        // This request's own context: who asked, beside the server's shared tables.
        let ctx = &Ctx {
            caller,
            ..self.ctx.clone()
        };
        match (route, method) {
            (Route::ChatCompletions, &Method::POST) => {
                let body = read_body(&self.ctx.config, &self.bodies, &parts.headers, body).await?;
                chat_completions(backend, &body, ctx).await
            }
            (Route::Messages, &Method::POST) => {
                let body = read_body(&self.ctx.config, &self.bodies, &parts.headers, body).await?;
                crate::anthropic::messages(backend, &body, ctx).await
            }
            (Route::CountTokens, &Method::POST) => {
                let body = read_body(&self.ctx.config, &self.bodies, &parts.headers, body).await?;
                crate::anthropic::count_tokens(backend, &body, ctx).await
            }
            (Route::Cancel, &Method::POST) => ctx.running.answer_cancel(rest, &caller),
            (Route::Responses, &Method::POST) => {
                let body = read_body(&self.ctx.config, &self.bodies, &parts.headers, body).await?;
                crate::responses::responses(backend, &body, ctx).await
            }
            (Route::OllamaChat | Route::OllamaGenerate, &Method::POST) => {
                let body = read_body(&self.ctx.config, &self.bodies, &parts.headers, body).await?;
                let endpoint = if route == Route::OllamaChat {
                    crate::ollama::request::Endpoint::Chat
                } else {
                    crate::ollama::request::Endpoint::Generate
                };
                crate::ollama::generate(backend, &body, ctx, endpoint).await
            }
            (Route::OllamaShow, &Method::POST) => {
                let body = read_body(&self.ctx.config, &self.bodies, &parts.headers, body).await?;
                crate::ollama::show(backend, &body).await
            }
            (Route::OllamaTags, &Method::GET) => Ok(crate::ollama::tags(backend).await),
            (Route::OllamaPs, &Method::GET) => Ok(crate::ollama::ps(backend).await),
            (Route::OllamaVersion, &Method::GET) => Ok(crate::ollama::version()),
            (Route::Models, &Method::GET) => {
                let models = backend.models().await;
                Ok(json_response(StatusCode::OK, &models_json(&models)))
            }
            (Route::NodeId, &Method::GET) => Ok(json_response(
                StatusCode::OK,
                &Value::String(backend.node_id()),
            )),
            (Route::State, &Method::GET) => {
                Ok(json_response(StatusCode::OK, &backend.state().await))
            }
            (Route::StatePath, &Method::GET) => {
                let state = backend.state().await;
                let subtree = cluster::state_subtree(&state, rest)?;
                Ok(json_response(StatusCode::OK, subtree))
            }
            (Route::PlaceInstance, &Method::POST) => {
                let body = read_body(&self.ctx.config, &self.bodies, &parts.headers, body).await?;
                let request = crate::exo::parse_place_instance(&body)?;
                let placed = backend.place_instance(request).await?;
                Ok(json_response(StatusCode::OK, &placed))
            }
            (Route::CreateInstance, &Method::POST) => {
                let body = read_body(&self.ctx.config, &self.bodies, &parts.headers, body).await?;
                let instance = crate::exo::parse_create_instance(&body)?;
                let created = backend.create_instance(instance).await?;
                Ok(json_response(StatusCode::OK, &created))
            }
            (Route::InstancePreviews, &Method::GET) => {
                let previews = cluster::previews(backend, query).await?;
                Ok(json_response(StatusCode::OK, &previews))
            }
            (Route::Instance, &Method::GET | &Method::DELETE) => {
                let id = cluster::percent_decode(rest).ok_or_else(|| {
                    ApiError::new(
                        ErrorKind::InvalidRequest,
                        "bad percent-encoding in the instance id",
                    )
                })?;
                let answer = if method == Method::GET {
                    backend.instance(id).await?
                } else {
                    backend.delete_instance(id).await?
                };
                Ok(json_response(StatusCode::OK, &answer))
            }
            (Route::Model, &Method::DELETE) => {
                let model = cluster::percent_decode(rest).ok_or_else(|| {
                    ApiError::new(
                        ErrorKind::InvalidRequest,
                        "bad percent-encoding in the model id",
                    )
                })?;
                let answer = backend.delete_model(model).await?;
                Ok(json_response(StatusCode::OK, &answer))
            }
            (Route::Dashboard, &Method::GET) => match crate::dashboard::find(rest) {
                Some(file) => Ok(crate::dashboard::response(file)),
                None => Err(ApiError::new(
                    ErrorKind::NotFound,
                    format!(
                        "the dashboard has no file `{}`; open / for its page",
                        echo(rest)
                    ),
                )
                .with_code("unknown_route")),
            },
            (Route::Events, &Method::GET) => self.events.open(),
            _ => Err(ApiError::new(
                ErrorKind::MethodNotAllowed,
                format!(
                    "{} is not allowed on {}; use {}",
                    echo(method.as_str()),
                    echo(path),
                    route.methods()
                ),
            )),
        }
    }
}
