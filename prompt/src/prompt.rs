//! The prompt, rendered where it runs: the model's chat template over the conversation,
//! tokenized on the node that holds rank 0, so that the prompt size is known when the request
//! is accepted (`usage.prompt_tokens`, and a 400 for a prompt longer than the context). The
//! runner receives token ids. Tools, earlier calls and tool results go through the template
//! too, as `transformers` renders them (`tools`, `message.tool_calls`, `role: "tool"`); for a
//! template that ignores them the node describes them itself (`tools_prompt`).
//!
//! **Stop strings** are enforced by the gateway, not passed to the engine: the engine holds
//! back text that may start a stop string and releases it only at the end, and the gateway
//! counts every token event towards `max_tokens`, so text released late could be cut.

use super::tools_prompt::{describe_tools, ListedTool};
use gateway::{AnswerForm, ApiError, ChatRequest, ErrorKind};
use models::ModelFacts;
use wire::request::{GenerateRequest, Prompt};

/// Builds the engine's request from the gateway's: the prompt as token ids, and the sampling
/// settings the request gave (the engine's defaults, greedy among them, for the others).
/// Also how to read the answer, which only the rendered prompt tells: whether it ended in an
/// open thought, the template's tool-call dialect, and the opening of a call that
/// `tool_choice` forced (`gateway::tools::forced_call`).
pub fn generate_request(
    request: &ChatRequest,
    facts: &ModelFacts,
) -> Result<(GenerateRequest, AnswerForm), ApiError> {
    // Images reach only a model with a vision tower: never dropped in silence.
    if facts.image_prompt.is_none() && request.messages.iter().any(|m| !m.images.is_empty()) {
        return Err(ApiError::invalid_field(
            "messages",
            format!(
                "model `{}` does not accept images; send text only, or choose a model that \
                 accepts images",
                request.model
            ),
        )
        .with_code("images_not_supported"));
    }
    // Every text the client sent, marked so that none can become a control token (see
    // `text::untrusted_text`): contents, names, call ids, arguments, tool specs.
    let offered = request.tool_choice.offered(&request.tools);
    // A conversation whose text alone surely exceeds the context is refused before it is
    // rendered and tokenized (which would cost memory in proportion to its size).
    let sent_bytes: usize = request
        .messages
        .iter()
        .map(|m| {
            m.content.len()
                + m.tool_calls
                    .iter()
                    .map(|c| c.arguments.len() + c.name.len())
                    .sum::<usize>()
        })
        .sum();
    if facts
        .tokenizer
        .surely_longer_than(sent_bytes, facts.context_length)
    {
        return Err(ApiError::invalid_field(
            "messages",
            format!(
                "the conversation is {sent_bytes} bytes, far more than the model's context of \
                 {} tokens holds; shorten the conversation",
                facts.context_length
            ),
        )
        .with_code("context_length_exceeded"));
    }
    // Longer in bytes than the context in tokens (every token spells at least a byte): count
    // the client's texts piece by piece, stopping once they pass the context, rather than
    // render and encode them whole first (a 1 MB system prompt grew the node by 141 MB).
    if sent_bytes > facts.context_length {
        let texts = request.messages.iter().flat_map(|m| {
            [m.content.as_str()].into_iter().chain(
                m.tool_calls
                    .iter()
                    .flat_map(|c| [c.name.as_str(), c.arguments.as_str()]),
            )
        });
        let over = facts
            .tokenizer
            .holds_more_than(texts, facts.context_length)
            .map_err(|e| ApiError::invalid_field("messages", e.to_string()))?;
        if over {
            return Err(ApiError::invalid_field(
                "messages",
                format!(
                    "the conversation holds more than the model's context of {} tokens; \
                     shorten the conversation",
                    facts.context_length
                ),
            )
            .with_code("context_length_exceeded"));
        }
    }
    let client_texts = request
        .messages
        .iter()
        .flat_map(|m| {
            let calls = m
                .tool_calls
                .iter()
                .flat_map(|c| [c.id.as_str(), c.name.as_str(), c.arguments.as_str()]);
            [m.content.as_str()]
                .into_iter()
                .chain(m.tool_call_id.as_deref())
                .chain(m.name.as_deref())
                .chain(calls)
        })
        .chain(offered.iter().flat_map(|t| {
            [t.name.as_str()]
                .into_iter()
                .chain(t.description.as_deref())
                .chain(t.parameters.as_deref())
        }));
    let marks = facts
        .tokenizer
        .untrusted_marks(client_texts)
        .map_err(|e| ApiError::invalid_field("messages", e.to_string()))?;
    let mark = |text: &str| match &marks {
        Some(marks) => marks.mark(text),
        None => text.to_string(),
    };
    let mut messages: Vec<text::ChatMessage> = request
        .messages
        .iter()
        .map(|m| {
            // Templates know `system`; OpenAI's newer `developer` role means the same.
            let role = if m.role == "developer" {
                "system"
            } else {
                &m.role
            };
            text::ChatMessage {
                tool_calls: m
                    .tool_calls
                    .iter()
                    .map(|c| text::ToolCall {
                        id: mark(&c.id),
                        name: mark(&c.name),
                        arguments: mark(&c.arguments),
                    })
                    .collect(),
                tool_call_id: m.tool_call_id.as_deref().map(mark),
                name: m.name.as_deref().map(mark),
                // The template shows each image where the message has it.
                images: m.images.clone(),
                ..text::ChatMessage::new(role, mark(&m.content))
            }
        })
        .collect();
    // The tools the choice keeps (none for `tool_choice: "none"`), as the template lists them.
    let tools: Vec<text::ToolSpec> = offered
        .iter()
        .map(|t| text::ToolSpec {
            name: mark(&t.name),
            description: t.description.as_deref().map(mark),
            parameters: t.parameters.as_deref().map(mark),
        })
        .collect();
    // A template that ignores tools: the node describes them (see `tools_prompt`).
    let listed: Vec<ListedTool> = offered
        .iter()
        .map(|t| ListedTool {
            name: &t.name,
            description: t.description.as_deref(),
            parameters: t.parameters.as_deref(),
        })
        .collect();
    describe_tools(
        facts.tokenizer.chat_template.as_deref(),
        &listed,
        &mut messages,
        &mark,
    );
    let input = text::TemplateInput {
        messages: &messages,
        tools: (!tools.is_empty()).then_some(&tools[..]),
        add_generation_prompt: true,
        enable_thinking: request.enable_thinking,
        reasoning_effort: request.reasoning_effort.as_deref(),
        ..text::TemplateInput::default()
    };
    let mut text = facts.tokenizer.render_chat(&input).map_err(|e| {
        ApiError::invalid_field("messages", format!("cannot apply the chat template: {e}"))
    })?;
    let template = facts.tokenizer.chat_template.as_deref();
    let mut form = AnswerForm::of_prompt(template, &text);
    // `tool_choice` required or named: the answer opens with the call.
    let call_grammar =
        gateway::tools::forced_call::apply(request, template, &mut text, &mut form, &mark);
    // Structured output (or the forced call's arguments): decoded under a grammar.
    let constraint = super::structured::output_constraint(
        request.response_format.as_ref(),
        call_grammar,
        facts,
    )?;
    // Each image the template placed becomes the model's image-token run (a client's text
    // cannot place one: its special-token texts are marked). The runner gets the files.
    let images: Vec<wire::chat::ChatImage> = messages
        .iter_mut()
        .flat_map(|m| std::mem::take(&mut m.images))
        .collect();
    if let (false, Some(vision)) = (images.is_empty(), &facts.image_prompt) {
        text = vision.expand_images(&text, &images).map_err(|e| {
            ApiError::invalid_field("messages", e).with_code("images_not_supported")
        })?;
    }
    // Only the template's markup may become control tokens, never a client's text.
    let ids = match &marks {
        Some(marks) => facts.tokenizer.encode_marked(&text, marks),
        None => facts.tokenizer.encode(&text),
    }
    .map_err(|e| ApiError::internal(format!("tokenizing the prompt failed: {e}")))?;
    if ids.len() >= facts.context_length {
        return Err(ApiError::invalid_field(
            "messages",
            format!(
                "the prompt is {} tokens, the model's context is {}; shorten the conversation",
                ids.len(),
                facts.context_length
            ),
        )
        .with_code("context_length_exceeded"));
    }
    let s = &request.sampling;
    let max_tokens = s
        .max_tokens
        .map(|m| m as usize)
        .unwrap_or(facts.context_length);
    let mut out = GenerateRequest::new(Prompt::Tokens(ids), max_tokens);
    out.ignore_eos = s.ignore_eos;
    out.constraint = constraint;
    out.images = images;
    let p = &mut out.sampling;
    if let Some(t) = s.temperature {
        p.temperature = t;
    }
    if let Some(v) = s.top_p {
        p.top_p = v;
    }
    if let Some(v) = s.top_k {
        p.top_k = v as usize;
    }
    if let Some(v) = s.min_p {
        p.min_p = v;
    }
    p.seed = s.seed;
    if let Some(v) = s.presence_penalty {
        p.presence_penalty = v;
    }
    if let Some(v) = s.frequency_penalty {
        p.frequency_penalty = v;
    }
    p.top_logprobs = s.logprobs.unwrap_or(0) as usize;
    p.logit_bias = s.logit_bias.clone();
    p.validate()
        .and_then(|()| p.check_vocab(facts.vocab_size))
        .map_err(|e| {
            let message = e.to_string();
            let param = sampling_param(&message);
            ApiError::new(ErrorKind::InvalidRequest, message).with_param(param)
        })?;
    Ok((out, form))
}

/// The request field an engine's sampling refusal is about (its message names it first), so
/// that the 400 names its `param` as the gateway's own refusals do.
fn sampling_param(message: &str) -> &'static str {
    let message = message.trim_start_matches("invalid request: ");
    [
        "temperature",
        "top_p",
        "top_k",
        "min_p",
        "repetition_penalty",
        "presence_penalty",
        "frequency_penalty",
        "top_logprobs",
        "logit_bias",
    ]
    .into_iter()
    .find(|p| message.starts_with(p))
    .unwrap_or(if message.starts_with("presence") {
        "presence_penalty"
    } else {
        "sampling"
    })
}

#[cfg(test)]
mod tests {
    use super::sampling_param;

    #[test]
    fn engine_refusals_name_their_field() {
        assert_eq!(sampling_param("top_p must be in (0, 1]"), "top_p");
        assert_eq!(
            sampling_param("invalid request: temperature must be a finite number >= 0"),
            "temperature"
        );
        assert_eq!(
            sampling_param("presence and frequency penalties must be finite"),
            "presence_penalty"
        );
        assert_eq!(sampling_param("something else"), "sampling");
        assert_eq!(
            sampling_param("logit_bias names token 99999, outside the vocabulary"),
            "logit_bias"
        );
        assert_eq!(
            sampling_param("top_logprobs must be at most 20, not 21"),
            "top_logprobs"
        );
    }
}
