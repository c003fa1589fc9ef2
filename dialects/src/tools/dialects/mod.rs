//! The dialects whose calls sit in marked blocks, one file each: each is a
//! [`crate::tools::block::Grammar`] run by [`crate::tools::block::BlockParser`]. Harmony
//! (gpt-oss), whose channels carry reasoning as well as calls, has its own parser
//! ([`crate::tools::harmony`]).

pub mod deepseek;
pub mod dsml;
pub mod gemma4;
pub mod glm;
pub mod kimi;
pub mod kimi_k3;
pub mod minimax;
pub mod minimax_m3;
pub mod qwen3_coder;

#[cfg(test)]
mod tests {
    use crate::tools::block::testing::tools;
    use crate::tools::block::{BlockParser, Grammar};
    use crate::tools::parse::ToolPiece;
    use crate::tools::stream::CallDelta;

    /// The argument deltas of `text`'s one call, written a character at a time (as tokens
    /// come) with arguments streaming.
    fn argument_deltas(grammar: &'static Grammar, text: &str) -> Vec<String> {
        let mut p = BlockParser::new(grammar, &tools());
        p.stream_arguments(true);
        let mut pieces: Vec<ToolPiece> =
            text.chars().flat_map(|c| p.push(&c.to_string())).collect();
        pieces.extend(p.finish());
        let mut deltas = Vec::new();
        let mut ended = Vec::new();
        for piece in pieces {
            match piece {
                ToolPiece::Stream(CallDelta::Arguments(a)) => deltas.push(a),
                ToolPiece::Stream(CallDelta::End(call)) => ended.push(call.arguments),
                ToolPiece::Stream(CallDelta::Start { .. }) => {}
                other => panic!("{text:?}: not one streamed call: {other:?}"),
            }
        }
        assert_eq!(
            ended,
            [deltas.concat()],
            "{text:?}: one call, its deltas joined"
        );
        deltas
    }

    /// The XML dialects stream a call of two parameters in several deltas (coding agents show
    /// it growing), each parameter as it closes, typed by the schema, joined the exact JSON.
    #[test]
    fn xml_dialects_stream_arguments_parameter_by_parameter() {
        let cases: [(&'static Grammar, &str); 3] = [
            (
                &super::qwen3_coder::GRAMMAR,
                "<tool_call>\n<function=get_weather>\n<parameter=city>\nZürich\n</parameter>\n\
                 <parameter=days>\n3\n</parameter>\n</function>\n</tool_call>",
            ),
            (
                &super::glm::GRAMMAR,
                "<tool_call>get_weather<arg_key>city</arg_key><arg_value>Zürich</arg_value>\
                 <arg_key>days</arg_key><arg_value>3</arg_value></tool_call>",
            ),
            (
                &super::minimax::GRAMMAR,
                "<minimax:tool_call>\n<invoke name=\"get_weather\">\n<parameter name=\"city\">\
                 Zürich</parameter>\n<parameter name=\"days\">3</parameter>\n</invoke>\n\
                 </minimax:tool_call>",
            ),
        ];
        for (grammar, text) in cases {
            let deltas = argument_deltas(grammar, text);
            assert!(deltas.len() >= 2, "{text:?}: {deltas:?}");
            assert_eq!(deltas.concat(), r#"{"city":"Zürich","days":3}"#, "{text:?}");
            // The first parameter goes out before the second is written.
            assert!(
                deltas
                    .iter()
                    .any(|d| d.contains("Zürich") && !d.contains("days")),
                "{text:?}: {deltas:?}"
            );
        }
    }
}
