//! Forwarding's protocol: each message's frames round-trip, bad frames are errors, never
//! panics.

use super::*;
use gateway::{ChatMessage, FinishReason, RequestedSampling, TokenLogprob};
use proptest::prelude::*;
use wire::FrameError;

fn encode<T: Serialize>(msg: &T) -> Result<Vec<u8>, FrameError> {
    CODEC.encode(msg)
}

fn decode<T: serde::de::DeserializeOwned>(bytes: &[u8]) -> Result<Option<(T, usize)>, FrameError> {
    CODEC.decode(bytes)
}

fn token(text: &str, logprob: Option<f32>) -> Reply {
    Reply::Event(ChatEvent::Token {
        text: text.into(),
        logprob: logprob.map(|logprob| TokenLogprob {
            token: text.into(),
            logprob,
            ..Default::default()
        }),
    })
}

fn chat() -> ChatRequest {
    ChatRequest {
        model: "default".into(),
        messages: vec![
            ChatMessage {
                role: "user".into(),
                content: "What is the capital of France?".into(),
                // Images travel with the chat to the node that runs the vision tower.
                images: vec![wire::chat::ChatImage {
                    data: vec![0x89, b'P', b'N', b'G', 0, 255],
                    width: 2,
                    height: 3,
                }],
                ..ChatMessage::default()
            },
            ChatMessage {
                role: "assistant".into(),
                content: String::new(),
                tool_calls: vec![gateway::ToolCall {
                    id: "a1B2c3D4e".into(),
                    name: "get_weather".into(),
                    arguments: r#"{"city":"Paris"}"#.into(),
                }],
                ..ChatMessage::default()
            },
            ChatMessage {
                role: "tool".into(),
                content: "sunny".into(),
                tool_call_id: Some("a1B2c3D4e".into()),
                name: Some("get_weather".into()),
                ..ChatMessage::default()
            },
        ],
        sampling: RequestedSampling {
            max_tokens: Some(16),
            temperature: Some(0.0),
            seed: Some(7),
            stop: vec!["\n\n".into()],
            logprobs: Some(0),
            ignore_eos: true,
            ..RequestedSampling::default()
        },
        user: Some("u".into()),
        // Tools, a call and its result travel too (rendered where the instance runs).
        tools: vec![gateway::Tool {
            name: "get_weather".into(),
            description: Some("Weather «now»".into()),
            parameters: Some(r#"{"type":"object","properties":{"city":{"type":"string"}}}"#.into()),
            strict: false,
        }],
        tool_choice: gateway::ToolChoice::Function("get_weather".into()),
        enable_thinking: Some(false),
        reasoning_effort: Some("high".into()),
        // A structured output's schema travels to the node that renders the prompt.
        response_format: Some(gateway::response_format::ResponseFormat::JsonSchema {
            schema: r#"{"type":"object","properties":{"b":{},"a":{}}}"#.into(),
            field: "response_format.json_schema.schema".into(),
        }),
    }
}

#[test]
fn requests_and_replies_round_trip() {
    let request = Request {
        instance_id: "default-1".into(),
        chat: chat(),
    };
    let frame = encode(&request).unwrap();
    let (back, used) = decode::<Request>(&frame).unwrap().unwrap();
    assert_eq!(used, frame.len());
    assert_eq!(back.chat, chat());
    let error = ApiError::no_instance("default");
    let replies = vec![
        Reply::Accepted {
            prompt_tokens: 12,
            form: AnswerForm::default(),
        },
        token("Paris", Some(-0.25)),
        Reply::Event(ChatEvent::Done {
            finish_reason: FinishReason::Length,
            completion_tokens: 16,
        }),
        Reply::Failed {
            error: error.clone(),
        },
    ];
    let mut bytes = Vec::new();
    for r in &replies {
        bytes.extend(encode(r).unwrap());
    }
    let mut at = 0;
    for r in &replies {
        let (back, used) = decode::<Reply>(&bytes[at..]).unwrap().unwrap();
        assert_eq!(&back, r);
        at += used;
    }
    let Some((Reply::Failed { error: wire }, _)) =
        decode::<Reply>(&encode(&replies[3]).unwrap()).unwrap()
    else {
        unreachable!()
    };
    assert_eq!(wire, error);
}

#[test]
fn messages_keep_their_json() {
    let body = |msg: &Reply| String::from_utf8(encode(msg).unwrap()[4..].to_vec()).unwrap();
    assert_eq!(
        body(&token("Paris", Some(-0.25))),
        r#"{"v":1,"msg":{"type":"token","text":"Paris","logprob":-0.25}}"#
    );
    assert_eq!(
        body(&token("a", None)),
        r#"{"v":1,"msg":{"type":"token","text":"a","logprob":null}}"#
    );
    assert_eq!(
        body(&Reply::Event(ChatEvent::Done {
            finish_reason: FinishReason::Stop,
            completion_tokens: 3
        })),
        r#"{"v":1,"msg":{"type":"done","finish_reason":"stop","completion_tokens":3}}"#
    );
    let cached = Reply::Event(ChatEvent::Cached { tokens: 412 });
    assert_eq!(
        body(&cached),
        r#"{"v":1,"msg":{"type":"cached","tokens":412}}"#
    );
    let back: Reply = serde_json::from_str(r#"{"type":"cached","tokens":412}"#).unwrap();
    assert_eq!(back, cached);
    assert_eq!(
        body(&Reply::Accepted {
            prompt_tokens: 12,
            form: AnswerForm::default(),
        }),
        r#"{"v":1,"msg":{"type":"accepted","prompt_tokens":12}}"#
    );
    // How to read the answer travels with the acceptance, where the prompt was rendered.
    let opened = Reply::Accepted {
        prompt_tokens: 12,
        form: AnswerForm {
            opens_in_thought: true,
            dialect: dialects::tools::dialect::Dialect::Glm,
            primed: "<tool_call>get_weather".into(),
        },
    };
    assert_eq!(
        body(&opened),
        r#"{"v":1,"msg":{"type":"accepted","prompt_tokens":12,"form":{"opens_in_thought":true,"dialect":"glm","primed":"<tool_call>get_weather"}}}"#
    );
    let back: Reply = serde_json::from_str(
        r#"{"type":"accepted","prompt_tokens":12,"form":{"opens_in_thought":true,"dialect":"glm","primed":"<tool_call>get_weather"}}"#,
    )
    .unwrap();
    assert_eq!(back, opened);
    assert_eq!(
        body(&Reply::Failed {
            error: ApiError::instance_lost("x").with_code("c")
        }),
        format!(
            r#"{{"v":1,"msg":{{"type":"failed","error":{{"kind":"unavailable","message":{:?},"param":null,"code":"c"}}}}}}"#,
            ApiError::instance_lost("x").message
        )
    );
    let request = Request {
        instance_id: "i".into(),
        chat: ChatRequest {
            model: "m".into(),
            messages: vec![],
            sampling: RequestedSampling::default(),
            user: None,
            ..ChatRequest::default()
        },
    };
    let text = String::from_utf8(encode(&request).unwrap()[4..].to_vec()).unwrap();
    assert_eq!(
        text,
        r#"{"v":1,"msg":{"instance_id":"i","chat":{"model":"m","messages":[],"sampling":{"max_tokens":null,"temperature":null,"top_p":null,"top_k":null,"min_p":null,"seed":null,"stop":[],"presence_penalty":null,"frequency_penalty":null,"logprobs":null,"ignore_eos":false},"user":null}}}"#
    );
    // Older peers leave out `sampling`, `user` and `ignore_eos`; unknown error kinds read
    // as internal ones.
    let old = r#"{"v":1,"msg":{"instance_id":"i","chat":{"model":"m","messages":[{"role":"user","content":"hi"}]}}}"#;
    let back: Request = CODEC.decode_body(old.as_bytes()).unwrap();
    assert_eq!(back.chat.sampling, RequestedSampling::default());
    let odd = r#"{"v":1,"msg":{"type":"failed","error":{"kind":"martian","message":"m"}}}"#;
    let Reply::Failed { error } = CODEC.decode_body::<Reply>(odd.as_bytes()).unwrap() else {
        panic!("a failure")
    };
    assert_eq!(error.kind, ErrorKind::Internal);
}

#[test]
fn bad_frames_are_refused() {
    assert_eq!(
        decode::<Reply>(&u32::MAX.to_le_bytes()),
        Err(FrameError::TooLarge(u32::MAX as usize))
    );
    let body = br#"{"v":9,"msg":{"type":"done"}}"#;
    let mut frame = (body.len() as u32).to_le_bytes().to_vec();
    frame.extend_from_slice(body);
    assert_eq!(decode::<Reply>(&frame), Err(FrameError::Version(9)));
    let body = br#"{"v":1,"msg":{"type":"explode"}}"#;
    let mut frame = (body.len() as u32).to_le_bytes().to_vec();
    frame.extend_from_slice(body);
    assert!(matches!(
        decode::<Reply>(&frame),
        Err(FrameError::Malformed(_))
    ));
    // Incomplete input is "not yet", not an error.
    let full = encode(&Reply::Accepted {
        prompt_tokens: 1,
        form: AnswerForm::default(),
    })
    .unwrap();
    assert_eq!(decode::<Reply>(&full[..full.len() - 1]), Ok(None));
    assert_eq!(decode::<Reply>(&full[..3]), Ok(None));
}

#[test]
fn alpns_are_scoped_by_namespace() {
    assert!(chat_alpn("shoal").starts_with(CHAT_ALPN));
    assert_ne!(chat_alpn("shoal"), chat_alpn("lab"));
    assert_ne!(chat_alpn("shoal"), mesh::net::sync_alpn("shoal"));
    assert_ne!(chat_alpn("shoal"), models::peer::files_alpn("shoal"));
}

proptest! {
    #[test]
    fn decoding_arbitrary_bytes_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
        let _ = decode::<Request>(&bytes);
        let _ = decode::<Reply>(&bytes);
    }

    #[test]
    fn decoding_arbitrary_json_bodies_never_panics(
        v in 0u32..3,
        text in "\\PC{0,200}",
        kind in prop::sample::select(vec!["accepted", "refused", "token", "done", "failed", "x"]),
    ) {
        let body = format!(r#"{{"v":{v},"msg":{{"type":"{kind}","text":{text:?},"prompt_tokens":{}}}}}"#, text.len());
        let mut frame = (body.len() as u32).to_le_bytes().to_vec();
        frame.extend_from_slice(body.as_bytes());
        let _ = decode::<Reply>(&frame);
        let _ = decode::<Request>(&frame);
    }

    #[test]
    fn any_token_text_round_trips(text in "\\PC{0,64}", logprob in -100.0f32..0.0) {
        let reply = token(&text, Some(logprob));
        let frame = encode(&reply).unwrap();
        prop_assert_eq!(decode::<Reply>(&frame).unwrap().unwrap().0, reply);
    }
}
