//! The grammar text of forced calls, family by family (see `call_grammar.rs`).

use super::*;

fn tool(name: &str, parameters: Option<&str>) -> Tool {
    Tool {
        name: name.into(),
        description: None,
        parameters: parameters.map(str::to_owned),
        strict: false,
    }
}

#[test]
fn a_named_call_grammar_holds_the_tool_schema_in_its_key_order() {
    let t = tool(
        "get_weather",
        Some(r#"{"type": "object", "properties": {"z": {}, "a": {}}}"#),
    );
    let g = call_grammar(
        Opener::Hermes,
        &ToolChoice::Function("get_weather".into()),
        &[&t],
        0,
    )
    .unwrap();
    assert!(g.without_brace);
    assert!(
        g.lark
            .starts_with("start: args \"}\\n\" ctl_0\nargs: %json {"),
        "{}",
        g.lark
    );
    assert!(
        g.lark.ends_with("\nctl_0: \"</tool_call>\"\n"),
        "{}",
        g.lark
    );
    assert!(g.lark.find("\"z\"").unwrap() < g.lark.find("\"a\"").unwrap());
    assert!(
        g.lark.contains("\"whitespace_flexible\":false"),
        "{}",
        g.lark
    );
    assert_eq!(
        call_grammar(Opener::Gemma4, &ToolChoice::Required, &[&t], 0),
        None
    );
    // Mistral's `[ARGS]` form: the name, the control token, the arguments, nothing after.
    let g = call_grammar(Opener::MistralArgs, &ToolChoice::Required, &[&t], 0).unwrap();
    assert!(
        g.lark
            .starts_with("start: call_0\ncall_0: \"get_weather\" ctl_0 args_0 \nargs_0: %json {"),
        "{}",
        g.lark
    );
    assert!(g.lark.ends_with("\nctl_0: \"[ARGS]\"\n"), "{}", g.lark);
    let g = call_grammar(
        Opener::MistralArgs,
        &ToolChoice::Function("get_weather".into()),
        &[&t],
        0,
    )
    .unwrap();
    assert!(g.without_brace);
    assert!(
        g.lark.starts_with("start: args\nargs: %json {"),
        "{}",
        g.lark
    );
    assert_eq!(
        call_grammar(Opener::Hermes, &ToolChoice::Auto, &[&t], 0),
        None
    );
}

#[test]
fn json_families_write_their_control_tokens_as_rules() {
    let t = tool("get_weather", None);
    let named = ToolChoice::Function("get_weather".into());
    let g = call_grammar(Opener::Harmony, &named, &[&t], 0).unwrap();
    // The call ends with harmony's end token, which is the model's.
    assert!(
        g.lark.starts_with("start: args\nargs: %json {"),
        "{}",
        g.lark
    );
    let g = call_grammar(Opener::Harmony, &ToolChoice::Required, &[&t], 0).unwrap();
    assert!(
        g.lark
            .contains("call_0: \"get_weather\" ctl_0 \"commentary json\" ctl_1 args_0 \n"),
        "{}",
        g.lark
    );
    assert!(
        g.lark
            .ends_with("ctl_0: \"<|channel|>\"\nctl_1: \"<|message|>\"\n"),
        "{}",
        g.lark
    );
    // Kimi's ids count the conversation's calls.
    let g = call_grammar(Opener::Kimi, &ToolChoice::Required, &[&t], 3).unwrap();
    assert!(
        g.lark
            .contains("\"get_weather:3\" ctl_0 args_0 ctl_1 ctl_2"),
        "{}",
        g.lark
    );
    assert!(
        g.lark.contains("ctl_2: \"<|tool_calls_section_end|>\"\n"),
        "{}",
        g.lark
    );
}

#[test]
fn xml_families_write_each_property_in_its_tags() {
    let t = tool(
        "get_weather",
        Some(
            r#"{"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer", "minimum": 1}}, "required": ["city"]}"#,
        ),
    );
    let named = ToolChoice::Function("get_weather".into());
    let g = call_grammar(Opener::MiniMax, &named, &[&t], 0).unwrap();
    assert!(
        g.lark
            .starts_with("start: arg_0 arg_1? \"</invoke>\\n\" ctl_0\n"),
        "{}",
        g.lark
    );
    assert!(
        g.lark
            .contains("arg_0: \"<parameter name=\\\"city\\\">\" /[^<]*/ \"</parameter>\\n\"\n"),
        "{}",
        g.lark
    );
    assert!(
        g.lark
            .contains("arg_1_value: %json {\"type\":\"integer\",\"minimum\":1,"),
        "{}",
        g.lark
    );
    assert!(
        g.lark.ends_with("ctl_0: \"</minimax:tool_call>\"\n"),
        "{}",
        g.lark
    );
    let g = call_grammar(Opener::Glm, &ToolChoice::Required, &[&t], 0).unwrap();
    assert!(g.lark.starts_with("start: call_0\n"), "{}", g.lark);
    assert!(
        g.lark
            .contains("arg_0_0: \"\\n\" ctl_0 \"city\" ctl_1 \"\\n\" ctl_2 /[^<]*/ ctl_3\n"),
        "{}",
        g.lark
    );
    assert!(
        g.lark
            .contains("call_0: \"get_weather\" arg_0_0 arg_0_1? \"\\n\" ctl_4\n"),
        "{}",
        g.lark
    );
    assert_eq!(call_grammar(Opener::Gemma4, &named, &[&t], 0), None);
    // MiniMax M3: each tag behind its marker, the closing tag named by the key.
    let g = call_grammar(Opener::MiniMaxM3, &named, &[&t], 0).unwrap();
    assert!(
        g.lark
            .contains("arg_0: ctl_0 \"<city>\" /[^<\\]]*/ ctl_0 \"</city>\"\n"),
        "{}",
        g.lark
    );
    assert!(g.lark.ends_with("ctl_0: \"]<]minimax[>[\"\n"), "{}", g.lark);
}

#[test]
fn required_offers_every_tool_by_name() {
    let a = tool("a", None);
    let b = tool("say \"hi\"", Some("[]"));
    let g = call_grammar(Opener::Hermes, &ToolChoice::Required, &[&a, &b], 0).unwrap();
    assert!(!g.without_brace);
    assert!(g.lark.starts_with("start: call_0 | call_1\n"), "{}", g.lark);
    assert!(
        g.lark
            .contains(r#"call_1: "say \"hi\"\", \"arguments\": " args_1 "}\n" ctl_0"#),
        "{}",
        g.lark
    );
    assert!(
        g.lark.contains(r#"args_1: %json {"type":"object""#),
        "{}",
        g.lark
    );
}
