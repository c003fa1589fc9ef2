//! A request's `tool_choice` forced on the rendered prompt: the opening the family's dialect
//! gives ([`dialects::tools::forced`]) appended after the template's generation prompt, and the
//! grammar the rest of the call is decoded under. Here, beside the request it reads (which the
//! dialects do not know), for the node that renders the prompt and the fake backend.

use crate::backend::ChatRequest;
use dialects::answer::AnswerForm;
use dialects::tools::call_grammar::call_grammar;
use dialects::tools::forced::{opening, Opener};
use dialects::tools::lazy_grammar::lazy_grammar;
use dialects::tools::ToolChoice;

/// Forces `request`'s `tool_choice` on a prompt rendered by `template`: appends the opening
/// to `prompt` and primes `form` with it. Nothing when the choice is `auto` or `none`, or no
/// tool is offered. `mark`: how a client's text is written into the prompt. Answers the
/// grammar (llguidance's Lark) the rest of the call must be decoded under, for the families
/// that have one ([`dialects::tools::call_grammar`]); the opening then leaves the arguments to it.
/// Under `auto`, when every tool offered is `strict`, nothing is appended and the grammar is
/// the lazy one ([`dialects::tools::lazy_grammar`]): prose, or calls that fit.
pub fn apply(
    request: &ChatRequest,
    template: Option<&str>,
    prompt: &mut String,
    form: &mut AnswerForm,
    mark: &dyn Fn(&str) -> String,
) -> Option<String> {
    let offered = request.tool_choice.offered(&request.tools);
    if offered.is_empty() {
        return None;
    }
    // Under `auto` a response format binds the prose, which the lazy grammar leaves free: the
    // format wins, and strict calls are checked after the fact as every call is.
    if request.tool_choice == ToolChoice::Auto {
        if request.response_format.is_some() {
            return None;
        }
        return lazy_grammar(Opener::of_template(template), &offered);
    }
    // `required` with one tool offered can only call that one: its name is forced too (what
    // a grammar over the names would allow), but not the end after it (`required` may call
    // it again).
    let choice = match (&request.tool_choice, offered.as_slice()) {
        (ToolChoice::Required, [only]) => ToolChoice::Function(only.name.clone()),
        (choice, _) => choice.clone(),
    };
    let earlier_calls = request.messages.iter().map(|m| m.tool_calls.len()).sum();
    let opener = Opener::of_template(template);
    let forced = opening(opener, &choice, earlier_calls, form.opens_in_thought, mark);
    let grammar = call_grammar(opener, &choice, &offered, earlier_calls);
    if let Some(mut forced) = forced {
        if grammar.as_ref().is_some_and(|g| g.without_brace) {
            for text in [&mut forced.prompt, &mut forced.primed] {
                if text.ends_with('{') {
                    text.pop();
                }
            }
        }
        prompt.push_str(&forced.prompt);
        form.primed = forced.primed;
    }
    grammar.map(|g| g.lark)
}
