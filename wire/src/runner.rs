//! The runner's wire format: length-prefixed, versioned JSON frames over a byte stream
//! (the runner's stdin and stdout).
//!
//! Frames are the shared codec's ([`crate::frame`]): a 4-byte little-endian length followed
//! by that many bytes of JSON `{"v": VERSION, "msg": ...}`. Frames larger than [`MAX_FRAME`]
//! and frames of another version are refused; decoding never panics.
//!
//! The runner speaks the one runner-status type, [`RunnerStatus`] (the replicated state's and
//! the worker plan's), in its tagged spelling.
//!
//! # Single-rank and multi-rank runners
//! - **A ring of one** (the whole model in this process): `Load` takes the runner through
//!   `loading` → `loaded` → `warming_up` → `ready` by itself. `Connect` is optional and answers
//!   `connected` at once.
//! - **A ring of n > 1** (one rank of a pipeline- or tensor-parallel instance): the node sends
//!   `Connect` (→ `connecting` → `connected`, or `failed` naming the neighbour that never came),
//!   then `Load` (→ `loading` → `loaded`, and no automatic warm-up), then `WarmUp` (→
//!   `warming_up` → `ready`). The node orders these across ranks with
//!   `placement::planning::next_action` (ranks below n−1 first, rank n−1 last).
//!   Only rank 0 accepts `Generate`; the other ranks serve the ring from `WarmUp` on until rank
//!   0 stops it (a `Shutdown` of rank 0 stops every rank) or a neighbour disappears (→ `failed`).
//!   A rank above 0 that rank 0 stopped exits 0 with no further event; a `Shutdown` sent to a
//!   rank above 0 exits it at once.
//! - **Exit codes**: 0 after a shutdown, 1 after `failed`, 3 after a load timeout (also
//!   reported as `failed`). A request in flight on rank 0 when the ring breaks ends with an
//!   `Error` event for it, then `failed`.

pub use crate::frame::FrameError;
use crate::request::{Completion, GenerateRequest, TokenLogprobs};
use crate::weight_format::WeightFormat;
use crate::Codec;
pub use placement::{RunnerStatus, Sharding};
use serde::{de::DeserializeOwned, Deserialize, Serialize};
use std::io::{Read, Write};

/// The environment variables the node sets for its runner: named here, by the protocol both
/// ends share, so the node's side (`runners`) need not link the runner's code (`inference`).
pub mod env {
    /// Environment variable asking for MLX's fast synchronisation: `1`/`true`/`on` or
    /// `0`/`false`/`off` (the node's `--fast-synch`/`--no-fast-synch`).
    pub const FAST_SYNCH_ENV: &str = "SHOAL_FAST_SYNCH";
    /// Sequences one instance decodes together at most (`--max-sequences`).
    pub const MAX_SEQUENCES_ENV: &str = "SHOAL_MAX_SEQUENCES";
    /// The KV-cache budget of one instance in MiB (`--kv-budget-mb`).
    pub const KV_BUDGET_ENV: &str = "SHOAL_KV_BUDGET_MB";
    /// The default of [`MAX_SEQUENCES_ENV`] (mlx-lm's server decodes 32 at once by default).
    pub const DEFAULT_MAX_SEQUENCES: usize = 32;
    /// Environment variable sizing the prompt cache in positions (the node's
    /// `--prompt-cache-tokens`); 0 disables it. Default: half the instance's KV budget.
    pub const PROMPT_CACHE_ENV: &str = "SHOAL_PROMPT_CACHE_TOKENS";
}

/// Version of this protocol; both ends must speak the same.
pub const VERSION: u32 = 2;
/// Largest frame accepted (a prompt of a few hundred thousand tokens fits).
pub const MAX_FRAME: usize = 16 << 20;

/// What the node asks of its runner.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum NodeCommand {
    /// Join the instance's MLX ring (see the module docs); once per runner, before `Load`.
    Connect {
        /// This runner's rank, `0..hosts.len()`.
        rank: usize,
        /// Every rank's `ip:port` addresses in rank order, as this node's ring view has them:
        /// its own entry `0.0.0.0:PORT`, its neighbours at their IPs, the others placeholders.
        hosts: Vec<Vec<String>>,
        /// How long to wait for the ring neighbours, in milliseconds.
        timeout_ms: u64,
    },
    /// Load a model (once per runner).
    Load {
        /// GGUF file or Hugging Face folder.
        model: String,
        /// Layers `[start, end)` to hold (default: all).
        #[serde(default)]
        layers: Option<(usize, usize)>,
        /// Weight representation (default: the backend's fastest).
        #[serde(default)]
        format: Option<WeightFormat>,
        /// How a ring of several ranks splits the model (ignored by a ring of one).
        #[serde(default = "default_sharding")]
        sharding: Sharding,
    },
    /// Warm up a loaded rank of a multi-rank ring (a ring of one warms up inside `Load`).
    WarmUp,
    /// Generate a completion; tokens stream back as [`Event::Token`].
    Generate {
        /// The node's id for this request.
        id: u64,
        /// The request.
        request: GenerateRequest,
    },
    /// Stop a running generation after its current token.
    Cancel {
        /// The request to stop.
        id: u64,
    },
    /// Exit cleanly.
    Shutdown,
}

/// What the runner tells its node.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Event {
    /// The runner's state changed (spelled `{"type": "state", "state": "loading", "done": 3,
    /// "total": 30}`, see [`crate::runner_status`]). A runner reports only the start-up states,
    /// `ready`, `running` and `failed`; the stopping states are the node's.
    State(#[serde(with = "crate::runner_status")] RunnerStatus),
    /// A generated token.
    Token {
        /// The request.
        id: u64,
        /// Token id.
        token: u32,
        /// New text (may be empty).
        text: String,
        /// Log-probability of the token.
        logprob: f32,
        /// The token's own text and the most likely tokens, when the request asked for
        /// `top_logprobs` (left out otherwise, and absent from older runners' frames).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        top_logprobs: Option<TokenLogprobs>,
    },
    /// Leading tokens of a request's prompt whose state came from the prompt cache: sent
    /// before its first token, only when there were some (the APIs' `cached_tokens`).
    Cached {
        /// The request.
        id: u64,
        /// How many prompt tokens were not computed again.
        tokens: usize,
    },
    /// A generation finished.
    Done {
        /// The request.
        id: u64,
        /// The result.
        completion: Completion,
    },
    /// A batch step ended without a token for anyone (a prompt chunk was computed): sent so
    /// that the node's step deadline, which ends a runner that stops making progress (a hung
    /// rank of its ring), never fires on a long prompt.
    Stepped,
    /// A request failed (the runner stays ready).
    Error {
        /// The request, if the error belongs to one.
        id: Option<u64>,
        /// What went wrong.
        message: String,
    },
}

fn default_sharding() -> Sharding {
    Sharding::Pipeline
}

/// The frames of this protocol: version [`VERSION`], at most [`MAX_FRAME`] bytes.
pub const CODEC: Codec = Codec::new(VERSION, MAX_FRAME);

/// Writes one frame and flushes.
pub fn write_frame<T: Serialize>(w: &mut impl Write, msg: &T) -> Result<(), FrameError> {
    CODEC.write(w, msg)
}

/// Decodes the body of one frame.
pub fn decode_body<T: DeserializeOwned>(body: &[u8]) -> Result<T, FrameError> {
    CODEC.decode_body(body)
}

/// Reads one frame; [`FrameError::Closed`] at a clean end of stream.
pub fn read_frame<T: DeserializeOwned>(r: &mut impl Read) -> Result<T, FrameError> {
    CODEC.read(r)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::request::Prompt;
    use proptest::prelude::*;

    #[test]
    fn frames_round_trip() {
        let cmds = vec![
            NodeCommand::Load {
                model: "/m.gguf".into(),
                layers: Some((0, 4)),
                format: Some(WeightFormat::F32),
                sharding: Sharding::Tensor,
            },
            NodeCommand::Connect {
                rank: 1,
                hosts: vec![vec!["10.0.0.1:5000".into()], vec!["0.0.0.0:5000".into()]],
                timeout_ms: 30_000,
            },
            NodeCommand::WarmUp,
            NodeCommand::Generate {
                id: 7,
                request: GenerateRequest::new(Prompt::Text("hi".into()), 5),
            },
            NodeCommand::Generate {
                id: 8,
                request: {
                    let mut r = GenerateRequest::new(Prompt::Tokens(vec![1, 2]), 3);
                    r.sampling.logit_bias = [(7042, 100.0), (3, -2.5)].into();
                    r.sampling.top_logprobs = 5;
                    r
                },
            },
            NodeCommand::Cancel { id: 7 },
            NodeCommand::Shutdown,
        ];
        let mut buf = Vec::new();
        for c in &cmds {
            write_frame(&mut buf, c).unwrap();
        }
        let mut r = &buf[..];
        for c in &cmds {
            assert_eq!(&read_frame::<NodeCommand>(&mut r).unwrap(), c);
        }
        assert!(matches!(
            read_frame::<NodeCommand>(&mut r),
            Err(FrameError::Closed)
        ));
    }

    #[test]
    fn bad_frames_are_refused() {
        let mut buf = Vec::new();
        write_frame(&mut buf, &NodeCommand::Shutdown).unwrap();
        // Another version.
        let body = br#"{"v":99,"msg":{"type":"shutdown"}}"#;
        let mut other = (body.len() as u32).to_le_bytes().to_vec();
        other.extend_from_slice(body);
        assert!(matches!(
            read_frame::<NodeCommand>(&mut &other[..]),
            Err(FrameError::Version(99))
        ));
        // Too large.
        let huge = (u32::MAX).to_le_bytes();
        assert!(matches!(
            read_frame::<NodeCommand>(&mut &huge[..]),
            Err(FrameError::TooLarge(_))
        ));
        // Cut short.
        assert!(matches!(
            read_frame::<NodeCommand>(&mut &buf[..buf.len() - 1]),
            Err(FrameError::Malformed(_))
        ));
        assert!(matches!(
            read_frame::<NodeCommand>(&mut &buf[..2]),
            Err(FrameError::Malformed(_))
        ));
        // Unknown message.
        let body = br#"{"v":2,"msg":{"type":"explode"}}"#;
        let mut unknown = (body.len() as u32).to_le_bytes().to_vec();
        unknown.extend_from_slice(body);
        assert!(matches!(
            read_frame::<NodeCommand>(&mut &unknown[..]),
            Err(FrameError::Malformed(_))
        ));
    }

    #[test]
    fn runner_states_are_the_plan_statuses_in_their_tagged_spelling() {
        // The runner's state reads straight into the plan's status (no second mapping).
        let read = |msg: &str| {
            decode_body::<Event>(format!(r#"{{"v":2,"msg":{msg}}}"#).as_bytes()).unwrap()
        };
        assert_eq!(
            read(r#"{"type":"state","state":"idle"}"#),
            Event::State(RunnerStatus::Idle)
        );
        assert_eq!(
            read(r#"{"type":"state","state":"loading","done":3,"total":30}"#),
            Event::State(RunnerStatus::Loading {
                layers_loaded: 3,
                total: 30
            })
        );
        assert_eq!(
            read(r#"{"type":"state","state":"failed","reason":"x"}"#),
            Event::State(RunnerStatus::Failed { reason: "x".into() })
        );
        let mut buf = Vec::new();
        write_frame(
            &mut buf,
            &Event::State(RunnerStatus::Loading {
                layers_loaded: 3,
                total: 30,
            }),
        )
        .unwrap();
        assert_eq!(
            &buf[4..],
            br#"{"v":2,"msg":{"type":"state","state":"loading","done":3,"total":30}}"#
        );
    }

    #[test]
    fn token_events_carry_top_logprobs_only_when_asked() {
        let plain = Event::Token {
            id: 3,
            token: 42,
            text: "Paris".into(),
            logprob: -0.25,
            top_logprobs: None,
        };
        let mut buf = Vec::new();
        write_frame(&mut buf, &plain).unwrap();
        // Without alternatives the frame is what older runners wrote, and reads back.
        assert_eq!(
            &buf[4..],
            br#"{"v":2,"msg":{"type":"token","id":3,"token":42,"text":"Paris","logprob":-0.25}}"#
        );
        assert_eq!(read_frame::<Event>(&mut &buf[..]).unwrap(), plain);
        let rich = Event::Token {
            id: 3,
            token: 42,
            text: "Paris".into(),
            logprob: -0.25,
            top_logprobs: Some(TokenLogprobs {
                text: " Paris".into(),
                bytes: b" Paris".to_vec(),
                top: vec![
                    crate::request::TopLogprob {
                        token: 42,
                        text: " Paris".into(),
                        logprob: -0.25,
                        bytes: b" Paris".to_vec(),
                    },
                    // Part of a character: its bytes are not its text's.
                    crate::request::TopLogprob {
                        token: 7,
                        text: "\u{FFFD}".into(),
                        logprob: -2.5,
                        bytes: vec![0xe2, 0x82],
                    },
                ],
            }),
        };
        let mut buf = Vec::new();
        write_frame(&mut buf, &rich).unwrap();
        assert_eq!(read_frame::<Event>(&mut &buf[..]).unwrap(), rich);
    }

    proptest! {
        #[test]
        fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
            let mut r = &bytes[..];
            for _ in 0..4 {
                if read_frame::<NodeCommand>(&mut r).is_err() {
                    break;
                }
            }
        }
    }
}
