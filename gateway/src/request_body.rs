//! Request bodies read under the node's limits: the size limit (413), the body timeout (408)
//! and the body budget shared by every request being read (503), counted as bytes arrive so
//! that connections announcing large bodies and sending nothing hold none of it.

use crate::config::GatewayConfig;
use crate::error::{ApiError, ErrorKind};
use bytes::Bytes;
use http_body_util::BodyExt;
use hyper::body::Body;
use hyper::header::CONTENT_LENGTH;
use std::sync::Arc;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// A request body as read, holding its share of the body budget until it is dropped (when
/// the request has been handled; a stream's request is parsed before its answer starts).
pub(crate) struct HeldBody {
    bytes: Bytes,
    _budget: Option<OwnedSemaphorePermit>,
}

impl std::ops::Deref for HeldBody {
    type Target = Bytes;
    fn deref(&self) -> &Bytes {
        &self.bytes
    }
}

impl Drop for HeldBody {
    fn drop(&mut self) {
        // Large bodies leave large free blocks behind; hand them back to the system.
        if self.bytes.len() >= crate::memory::TRIM_AFTER_BYTES {
            crate::memory::give_back_soon();
        }
    }
}

/// Reads a request body: 413 for anything over the configured limit (announced by
/// `Content-Length` or found while reading), 503 when the shared body budget cannot hold
/// it now, 408 when it does not arrive within the body timeout.
pub(crate) async fn read_body<B>(
    config: &GatewayConfig,
    bodies: &Arc<Semaphore>,
    headers: &hyper::HeaderMap,
    body: B,
) -> Result<HeldBody, ApiError>
where
    B: Body + Send,
    B::Data: Send,
    B::Error: std::error::Error + Send + Sync + 'static,
{
    let limit = config.body_limit;
    let too_large = || {
        ApiError::new(
            ErrorKind::PayloadTooLarge,
            format!("the request body is larger than this node's limit of {limit} bytes"),
        )
        .with_code("payload_too_large")
    };
    let announced = headers
        .get(CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if announced.is_some_and(|n| n > limit as u64) {
        return Err(too_large());
    }
    let read = async {
        // The budget counts bytes as they arrive, never the announced length: a few
        // connections announcing large bodies and sending nothing would otherwise hold the
        // whole budget and refuse every other POST (probed 2026-12-04). Memory too is
        // reserved only up to a small first share of what is announced.
        let mut held = Budget::new(bodies);
        let mut out = bytes::BytesMut::new();
        if let Some(n) = announced {
            out.reserve((n as usize).min(FIRST_RESERVE));
        }
        let mut body = std::pin::pin!(body);
        while let Some(frame) = body.frame().await {
            let frame = frame.map_err(|e| {
                ApiError::new(
                    ErrorKind::InvalidRequest,
                    format!("could not read the request body: {e}"),
                )
            })?;
            let Ok(mut data) = frame.into_data() else {
                continue;
            };
            use bytes::Buf;
            let size = out.len() + data.remaining();
            if size > limit {
                return Err(too_large());
            }
            held.grow_to(size)?;
            while data.has_remaining() {
                let chunk = data.chunk();
                let n = chunk.len();
                out.extend_from_slice(chunk);
                data.advance(n);
            }
        }
        Ok(HeldBody {
            bytes: out.freeze(),
            _budget: held.permit,
        })
    };
    match tokio::time::timeout(config.body_timeout, read).await {
        Ok(result) => result,
        Err(_) => Err(ApiError::new(
            ErrorKind::RequestTimeout,
            format!(
                "the request body did not arrive within {} s; send it whole, promptly",
                config.body_timeout.as_secs()
            ),
        )
        .with_code("body_timeout")),
    }
}

/// Bytes of an announced body reserved before any arrive (the rest as they do).
const FIRST_RESERVE: usize = 64 * 1024;

/// The `code` of a 503 for a body the shared budget cannot hold now.
pub(crate) const BODY_BUDGET_CODE: &str = "body_budget_exhausted";

/// The share of the body budget one request holds, grown as its bytes arrive.
struct Budget<'a> {
    budget: &'a Arc<Semaphore>,
    permit: Option<OwnedSemaphorePermit>,
    kib: usize,
}

impl<'a> Budget<'a> {
    fn new(budget: &'a Arc<Semaphore>) -> Budget<'a> {
        Budget {
            budget,
            permit: None,
            kib: 0,
        }
    }

    /// Holds enough of the budget for `bytes`, or answers 503 now: waiting would keep the
    /// connection and its bytes alive, which is what the budget is there to prevent.
    fn grow_to(&mut self, bytes: usize) -> Result<(), ApiError> {
        let want = bytes.div_ceil(1024);
        if want <= self.kib {
            return Ok(());
        }
        let more = u32::try_from(want - self.kib).unwrap_or(u32::MAX);
        let Ok(permit) = self.budget.clone().try_acquire_many_owned(more) else {
            return Err(ApiError::new(
                ErrorKind::Busy,
                "this node is holding as many request bytes as it takes at once (other large \
                 bodies are arriving now); retry shortly",
            )
            .with_code(BODY_BUDGET_CODE));
        };
        self.kib = want;
        match &mut self.permit {
            Some(held) => held.merge(permit),
            None => self.permit = Some(permit),
        }
        Ok(())
    }
}
