//! The cluster-API client for synchronous callers (the integration tests, the xtask): a
//! [`Blocking`] owns a small runtime and runs [`Api`]'s requests on it to the end.

use crate::client::{Answer, Api, ApiFailure, ChatStream};
use crate::sse::SseEvent;
use hyper::Method;
use serde_json::Value;
use std::future::Future;
use std::time::Duration;

/// An [`Api`] with its own runtime; every call blocks until it is answered.
pub struct Blocking {
    api: Api,
    runtime: tokio::runtime::Runtime,
}

impl Blocking {
    /// A blocking client of `api`.
    pub fn new(api: Api) -> Blocking {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a current-thread runtime starts");
        Blocking { api, runtime }
    }

    /// The API it talks to.
    pub fn api(&self) -> &Api {
        &self.api
    }

    /// Runs one of [`Api`]'s requests to the end, bounded by `limit`.
    pub fn run<'a, F, T>(
        &'a self,
        limit: Duration,
        request: impl FnOnce(&'a Api) -> F,
    ) -> Result<T, ApiFailure>
    where
        F: Future<Output = Result<T, ApiFailure>>,
    {
        // The timer is made inside the runtime, which it needs.
        self.runtime
            .block_on(async { tokio::time::timeout(limit, request(&self.api)).await })
            .unwrap_or_else(|_| {
                Err(ApiFailure {
                    status: None,
                    message: format!("no answer from {} within {limit:?}", self.api.url()),
                    body: None,
                })
            })
    }

    /// Any request, whatever the status of its answer (bounded by `limit`).
    pub fn call(
        &self,
        method: Method,
        path: &str,
        body: Option<&Value>,
        limit: Duration,
    ) -> Result<Answer, ApiFailure> {
        self.run(limit, |api| api.call(method, path, body))
    }

    /// A chat stream, read event by event.
    pub fn chat_stream(
        &self,
        body: &Value,
        limit: Duration,
    ) -> Result<BlockingStream<'_>, ApiFailure> {
        let stream = self.run(limit, |api| api.chat_stream(body))?;
        Ok(BlockingStream {
            runtime: &self.runtime,
            stream: Some(stream),
        })
    }
}

/// A chat stream read by a synchronous caller. Dropping it closes its connection, as a
/// client that goes away does.
pub struct BlockingStream<'a> {
    runtime: &'a tokio::runtime::Runtime,
    /// `None` only while it is dropped.
    stream: Option<ChatStream>,
}

impl Drop for BlockingStream<'_> {
    /// Drops the body, then lets the runtime run a moment: the connection's task runs only
    /// inside a call, and this is when it sees the body gone and closes the connection
    /// (without it the connection would stay open, unread, until the next call).
    fn drop(&mut self) {
        drop(self.stream.take());
        // The timer is made inside the runtime, which it needs.
        self.runtime
            .block_on(async { tokio::time::sleep(Duration::from_millis(20)).await });
    }
}

/// What [`BlockingStream::next`] got.
#[derive(Debug, Clone, PartialEq)]
pub enum Next {
    /// An event.
    Event(SseEvent),
    /// The body ended (cut off, if in the middle of an event).
    End {
        /// Whether it ended in the middle of an event.
        cut_off: bool,
    },
    /// Nothing came within the wait.
    Silent,
    /// The stream broke.
    Broken(String),
}

impl BlockingStream<'_> {
    /// The next event, waiting at most `wait`.
    pub fn next(&mut self, wait: Duration) -> Next {
        let Some(stream) = self.stream.as_mut() else {
            return Next::Broken("the stream was dropped".into());
        };
        match self
            .runtime
            .block_on(async { tokio::time::timeout(wait, stream.next()).await })
        {
            Err(_) => Next::Silent,
            Ok(Err(e)) => Next::Broken(e),
            Ok(Ok(Some(event))) => Next::Event(event),
            Ok(Ok(None)) => Next::End {
                cut_off: stream.cut_off(),
            },
        }
    }
}
