//! The real chat templates of the families whose call dialects the gateway parses
//! (`dialects::tools::dialects`, `dialects::tools::harmony`): GLM-4.6, GLM-4.7-Flash, MiniMax
//! M2, Kimi K2, DeepSeek V3.1, DeepSeek-R1-Distill, gpt-oss and Qwen3-Coder. Shoal's renders
//! (minijinja) of the tool conversation — tools, an earlier call, its result, the thinking
//! switch off and on — are byte-identical to jinja2's as `transformers` configures it, and
//! the earlier call is rendered in exactly the text the gateway's dialect tests parse, which is
//! what the models were trained to write. The prompt endings that open a thought (GLM-4.7,
//! MiniMax M2, DeepSeek V3.1 and R1-Distill in thinking mode) are asserted too: the gateway
//! reads such answers as starting in reasoning.
//!
//! Kimi-K2-Thinking's template cannot be compared: it calls `list.append`, which jinja2's
//! sandbox (the one `transformers` renders in) refuses; the test asserts that refusal.
//!
//! The templates come from the pinned `llama-cpp-python` sdist (`cargo xtask setup`).

mod reference;

use inference::{TemplateInput, ToolSpec};
use reference::tool_chat::{
    assert_same_as_jinja2, assert_same_as_jinja2_with, conversation, CLOCK,
};
use reference::{python_with_jinja2, reference_dir, render_with_jinja2, skip_without_reference};
use serde_json::json;
use text::chat_template::{render_template, template_variables};

#[test]
fn glm_4_6_renders_like_jinja2_with_arg_key_calls() {
    let Some(r) = assert_same_as_jinja2("GLM-4.6.jinja", "", "<|endoftext|>") else {
        return;
    };
    assert!(r[0].contains(
        "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Zürich</arg_value>\n\
         <arg_key>unit</arg_key>\n<arg_value>celsius</arg_value>\n</tool_call>"
    ));
    assert!(r[0].ends_with("<|assistant|>"), "{}", r[0]);
    assert!(r[3].ends_with("/nothink<|assistant|>\n<think></think>"));
}

#[test]
fn glm_4_7_renders_like_jinja2_and_opens_the_thought() {
    let Some(r) = assert_same_as_jinja2("GLM-4.7-Flash.jinja", "", "<|endoftext|>") else {
        return;
    };
    assert!(r[0].contains(
        "<tool_call>get_weather<arg_key>city</arg_key><arg_value>Zürich</arg_value>\
         <arg_key>unit</arg_key><arg_value>celsius</arg_value></tool_call>"
    ));
    assert!(r[0].ends_with("<|assistant|><think>"));
    assert!(r[3].ends_with("<|assistant|></think>"));
}

#[test]
fn minimax_m2_renders_like_jinja2_with_invoke_calls() {
    let Some(r) = assert_same_as_jinja2("MiniMax-M2.jinja", "]~!b[", "[e~[") else {
        return;
    };
    assert!(r[0].contains(
        "<minimax:tool_call>\n<invoke name=\"get_weather\">\n<parameter name=\"city\">Zürich\
         </parameter>\n<parameter name=\"unit\">celsius</parameter>\n</invoke>\n\
         </minimax:tool_call>"
    ));
    assert!(r[0].ends_with("]~b]ai\n<think>\n"));
}

#[test]
fn kimi_k2_renders_like_jinja2_with_call_sections() {
    let Some(r) = assert_same_as_jinja2("moonshotai-Kimi-K2.jinja", "[BOS]", "[EOS]") else {
        return;
    };
    assert!(r[0].contains(
        "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0\
         <|tool_call_argument_begin|>{\"city\": \"Zürich\", \"unit\": \"celsius\"}\
         <|tool_call_end|><|tool_calls_section_end|>"
    ));
    assert!(r[0].ends_with("<|im_assistant|>assistant<|im_middle|>"));
}

#[test]
fn deepseek_v3_1_renders_like_jinja2_with_its_thinking_switch() {
    let Some(r) = assert_same_as_jinja2(
        "deepseek-ai-DeepSeek-V3.1.jinja",
        "<｜begin▁of▁sentence｜>",
        "<｜end▁of▁sentence｜>",
    ) else {
        return;
    };
    assert!(r[0].contains(
        "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{\"city\": \
         \"Zürich\", \"unit\": \"celsius\"}<｜tool▁call▁end｜><｜tool▁calls▁end｜>"
    ));
    // Thinking off unless switched on; on, the prompt opens the thought.
    assert!(r[0].ends_with("<｜Assistant｜><think></think>"));
    assert!(r[4].ends_with("<｜Assistant｜><think>"), "{}", r[4]);
}

#[test]
fn deepseek_r1_distill_renders_like_jinja2_and_opens_the_thought() {
    let Some(r) = assert_same_as_jinja2(
        "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja",
        "<｜begin▁of▁sentence｜>",
        "<｜end▁of▁sentence｜>",
    ) else {
        return;
    };
    assert!(r[0].contains(
        "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n\
         ```json\n{\"city\": \"Zürich\", \"unit\": \"celsius\"}\n```<｜tool▁call▁end｜>\
         <｜tool▁calls▁end｜>"
    ));
    assert!(r[4].ends_with("<｜Assistant｜><think>\n"), "{}", r[4]);
    assert!(r[3].ends_with("<｜Assistant｜><think>\n</think>"));
}

#[test]
fn gpt_oss_renders_like_jinja2_with_harmony_calls() {
    let Some(r) =
        assert_same_as_jinja2("openai-gpt-oss-120b.jinja", "<|startoftext|>", "<|return|>")
    else {
        return;
    };
    assert!(r[0].contains(
        "<|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>\
         {\"city\": \"Zürich\", \"unit\": \"celsius\"}<|call|>"
    ));
    // The template's reasoning effort: medium unless the request sets one.
    assert!(r[0].contains("Reasoning: medium"));
    assert!(r[5].contains("Reasoning: high"));
    assert!(r[0].ends_with("<|start|>assistant"));
}

#[test]
fn qwen3_coder_renders_like_jinja2_with_function_calls() {
    // Its tool list prints schema values with Python's `str` (`1e-05` for 0.00001), which no
    // JSON writer matches: the schemas here have no such float.
    let tools = [ToolSpec {
        name: "get_weather".into(),
        description: Some("Current weather in a city".into()),
        parameters: Some(
            r#"{"type": "object", "properties": {"city": {"type": "string", "description": "City name"}, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}, "required": ["city"]}"#
                .into(),
        ),
    }];
    let Some(r) = assert_same_as_jinja2_with("Qwen3-Coder.jinja", "", "<|im_end|>", &tools) else {
        return;
    };
    assert!(r[0].contains(
        "<tool_call>\n<function=get_weather>\n<parameter=city>\nZürich\n</parameter>\n\
         <parameter=unit>\ncelsius\n</parameter>\n</function>\n</tool_call>"
    ));
}

#[test]
fn kimi_k2_thinking_is_refused_by_the_jinja2_sandbox() {
    if skip_without_reference() {
        return;
    }
    let Some(python) = python_with_jinja2() else {
        return;
    };
    let path = reference_dir()
        .join("templates")
        .join("Kimi-K2-Thinking.jinja");
    let template = std::fs::read_to_string(&path).unwrap();
    let messages = conversation();
    let input = TemplateInput {
        messages: &messages,
        tools: None,
        add_generation_prompt: true,
        enable_thinking: None,
        reasoning_effort: None,
        bos_token: "[BOS]",
        eos_token: "[EOS]",
    };
    let job = format!(
        r#"{{"template": {}, "variables": {}}}"#,
        json!(template),
        template_variables(&input)
    );
    let reference = render_with_jinja2(&python, &[job]);
    let error = reference[0].as_ref().expect_err("jinja2's sandbox refuses");
    assert!(error.contains("append"), "{error}");
    // Shoal's render, whatever it is, never panics.
    let _ = render_template(&template, &input, &CLOCK);
}
