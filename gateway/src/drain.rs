//! Stopping without cutting answers short: when the node is told to stop (SIGTERM), the
//! gateway stops taking chats (a new one is answered 503 `node_stopping`; the listener is
//! closed, so new connections are refused), lets the generations in flight finish within a
//! grace period (`shoal --drain-seconds`, default 10 s), and ends those still running then
//! with an error frame that says the node stopped (and `[DONE]`) rather than leaving the
//! client to find a connection cut. Only then are the runners stopped.

use crate::error::{ApiError, ErrorKind};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

/// The gateway's stop: shared by every request of one server.
#[derive(Debug, Clone, Default)]
pub struct Drain(Arc<Inner>);

#[derive(Debug, Default)]
struct Inner {
    /// Fired when the node begins to stop: no new chat is taken.
    stopping: CancellationToken,
    /// Fired when the grace period is over: the answers still running end with an error.
    cut: CancellationToken,
    /// Generations in flight (each holds an [`InFlight`]).
    in_flight: AtomicUsize,
    /// Woken whenever one ends.
    ended: Notify,
}

/// A generation in flight, counted until dropped.
#[derive(Debug)]
pub struct InFlight(Arc<Inner>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::SeqCst);
        self.0.ended.notify_waiters();
    }
}

impl Drain {
    /// Counts a new generation in flight; refused (503 `node_stopping`) once the node stops.
    pub fn enter(&self) -> Result<InFlight, ApiError> {
        self.0.in_flight.fetch_add(1, Ordering::SeqCst);
        let entered = InFlight(self.0.clone());
        if self.0.stopping.is_cancelled() {
            return Err(stopping_error(
                "this node is stopping and takes no new requests; send it to another node \
                 of the cluster, or retry once this one is back",
            ));
        }
        Ok(entered)
    }

    /// How many generations are in flight.
    pub fn in_flight(&self) -> usize {
        self.0.in_flight.load(Ordering::SeqCst)
    }

    /// Stops taking requests and waits until the generations in flight ended, at most
    /// `grace`; then cuts those still running (see [`Drain::cut`]) and waits up to a second
    /// for them to send their last frames. Answers how many had to be cut.
    pub async fn drain(&self, grace: Duration) -> usize {
        self.0.stopping.cancel();
        let finished = tokio::time::timeout(grace, self.idle()).await.is_ok();
        let cut = if finished { 0 } else { self.in_flight() };
        self.0.cut.cancel();
        if cut > 0 {
            let _ = tokio::time::timeout(Duration::from_secs(1), self.idle()).await;
        }
        cut
    }

    /// Resolves when no generation is in flight.
    async fn idle(&self) {
        loop {
            let ended = self.0.ended.notified();
            tokio::pin!(ended);
            ended.as_mut().enable();
            if self.in_flight() == 0 {
                return;
            }
            ended.await;
        }
    }

    /// Fires when the grace period is over: an answer still running ends then with
    /// [`cut_error`].
    pub fn cut(&self) -> tokio_util::sync::WaitForCancellationFuture<'_> {
        self.0.cut.cancelled()
    }
}

/// What an answer still running at the end of the grace period ends with.
pub fn cut_error() -> ApiError {
    stopping_error(
        "this node is stopping (SIGTERM) and the answer did not finish within its drain period \
         (shoal --drain-seconds); ask again, on another node of the cluster or once this one is \
         back",
    )
}

fn stopping_error(message: &str) -> ApiError {
    ApiError::new(ErrorKind::Unavailable, message).with_code("node_stopping")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn stopping_refuses_new_work_waits_for_old_and_cuts_what_outlives_the_grace() {
        let drain = Drain::default();
        let quick = drain.enter().unwrap();
        let slow = drain.enter().unwrap();
        assert_eq!(drain.in_flight(), 2);
        let started = tokio::time::Instant::now();
        let waiting = tokio::spawn({
            let drain = drain.clone();
            async move { drain.drain(Duration::from_millis(400)).await }
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        let refused = drain.enter().unwrap_err();
        assert_eq!(refused.code.as_deref(), Some("node_stopping"));
        assert_eq!(refused.status().as_u16(), 503);
        assert_eq!(drain.in_flight(), 2, "a refused request is not counted");
        drop(quick);
        // The slow one is cut when the grace ends, and then ends.
        let cut = drain.clone();
        tokio::spawn(async move {
            cut.cut().await;
            drop(slow);
        });
        assert_eq!(waiting.await.unwrap(), 1);
        assert!(started.elapsed() >= Duration::from_millis(400));
        assert_eq!(drain.in_flight(), 0);
    }

    #[tokio::test]
    async fn a_node_with_nothing_in_flight_stops_at_once() {
        let drain = Drain::default();
        let started = tokio::time::Instant::now();
        assert_eq!(drain.drain(Duration::from_secs(10)).await, 0);
        assert!(started.elapsed() < Duration::from_secs(1));
    }
}
