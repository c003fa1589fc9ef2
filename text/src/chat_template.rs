//! Chat templates: Hugging Face's Jinja templates rendered as `transformers` renders them,
//! with the date their `strftime_now` helper tells coming from a [`TemplateClock`] (the system
//! clock in production; tests pin a date to compare with reference renders).

use crate::error::{Result, TextError};
use std::time::{SystemTime, UNIX_EPOCH};

/// One message of a chat and a call an assistant turn made, as the gateway receives them and
/// the templates read them ([`wire::chat`]).
pub use wire::chat::{ChatMessage, ToolCall};

/// A function the model may call, as the template's `tools` list holds it:
/// `{"type": "function", "function": {"name", "description", "parameters"}}`.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ToolSpec {
    /// The function's name.
    pub name: String,
    /// What it does, for the model.
    pub description: Option<String>,
    /// Its JSON Schema as JSON text, keys in the order the client wrote them.
    pub parameters: Option<String>,
}

/// Everything a chat template is rendered with.
#[derive(Debug, Clone, Copy, Default)]
pub struct TemplateInput<'a> {
    /// The conversation.
    pub messages: &'a [ChatMessage],
    /// The tools offered; `None` leaves `tools` undefined (see [`template_variables`]).
    pub tools: Option<&'a [ToolSpec]>,
    /// Open the assistant's turn at the end.
    pub add_generation_prompt: bool,
    /// The thinking switch, passed only when set, as `enable_thinking` (Qwen3's name) and
    /// `thinking` (DeepSeek V3.1's; see [`template_variables`]).
    pub enable_thinking: Option<bool>,
    /// `reasoning_effort` (gpt-oss's `low`, `medium`, `high`), passed only when set.
    pub reasoning_effort: Option<&'a str>,
    /// The model's beginning-of-sequence token text.
    pub bos_token: &'a str,
    /// The model's end-of-sequence token text.
    pub eos_token: &'a str,
}

/// Where `strftime_now` gets the time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum TemplateClock {
    /// The system clock, in UTC: the date a prompt states is today's.
    #[default]
    SystemUtc,
    /// Always this moment (for tests whose expected renders state one date).
    Fixed(DateTime),
}

impl TemplateClock {
    /// The moment this clock tells now.
    pub fn now(&self) -> DateTime {
        match self {
            TemplateClock::SystemUtc => {
                let secs = SystemTime::now()
                    .duration_since(UNIX_EPOCH)
                    .map_or(0, |d| d.as_secs() as i64);
                DateTime::from_unix_seconds(secs)
            }
            TemplateClock::Fixed(at) => *at,
        }
    }
}

/// A moment of the proleptic Gregorian calendar, in UTC, to the second.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DateTime {
    /// Year (e.g. 2025).
    pub year: i64,
    /// Month, 1 to 12.
    pub month: u32,
    /// Day of the month, 1 to 31.
    pub day: u32,
    /// Hour, 0 to 23.
    pub hour: u32,
    /// Minute, 0 to 59.
    pub minute: u32,
    /// Second, 0 to 59.
    pub second: u32,
}

const MONTHS: [&str; 12] = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
];
const WEEKDAYS: [&str; 7] = [
    "Sunday",
    "Monday",
    "Tuesday",
    "Wednesday",
    "Thursday",
    "Friday",
    "Saturday",
];

/// Days from 1970-01-01 to `year-month-day` (Gregorian; negative before 1970).
fn days_from_civil(year: i64, month: u32, day: u32) -> i64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let m = month as i64;
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + day as i64 - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

impl DateTime {
    /// Midnight at the start of `year-month-day`.
    pub const fn midnight(year: i64, month: u32, day: u32) -> DateTime {
        DateTime {
            year,
            month,
            day,
            hour: 0,
            minute: 0,
            second: 0,
        }
    }

    /// The moment `secs` seconds after 1970-01-01 00:00:00 UTC.
    pub fn from_unix_seconds(secs: i64) -> DateTime {
        let (days, rest) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
        // Civil date of a day count, by 400-year eras of 146,097 days.
        let z = days + 719_468;
        let era = z.div_euclid(146_097);
        let doe = z - era * 146_097;
        let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
        let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
        let mp = (5 * doy + 2) / 153;
        let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
        let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
        let year = yoe + era * 400 + i64::from(month <= 2);
        DateTime {
            year,
            month,
            day,
            hour: (rest / 3600) as u32,
            minute: (rest % 3600 / 60) as u32,
            second: (rest % 60) as u32,
        }
    }

    fn days_since_epoch(&self) -> i64 {
        days_from_civil(self.year, self.month, self.day)
    }

    /// 0 for Sunday to 6 for Saturday (1970-01-01 was a Thursday).
    fn weekday(&self) -> usize {
        (self.days_since_epoch() + 4).rem_euclid(7) as usize
    }

    /// `format` with C `strftime` specifiers applied, as Python's `strftime` in the C locale
    /// for what chat templates print (`%Y-%m-%d`, `%d %b %Y`, `%B %d, %Y`, `%A`, `%H:%M`, ...);
    /// unknown specifiers are kept as written.
    pub fn strftime(&self, format: &str) -> String {
        let month = MONTHS[(self.month.clamp(1, 12) - 1) as usize];
        let weekday = WEEKDAYS[self.weekday()];
        let mut out = String::new();
        let mut chars = format.chars();
        while let Some(c) = chars.next() {
            if c != '%' {
                out.push(c);
                continue;
            }
            match chars.next() {
                Some('Y') => out.push_str(&self.year.to_string()),
                Some('y') => out.push_str(&format!("{:02}", self.year.rem_euclid(100))),
                Some('m') => out.push_str(&format!("{:02}", self.month)),
                Some('d') => out.push_str(&format!("{:02}", self.day)),
                Some('e') => out.push_str(&format!("{:2}", self.day)),
                Some('j') => {
                    let first = days_from_civil(self.year, 1, 1);
                    out.push_str(&format!("{:03}", self.days_since_epoch() - first + 1))
                }
                Some('b') | Some('h') => out.push_str(&month[..3]),
                Some('B') => out.push_str(month),
                Some('a') => out.push_str(&weekday[..3]),
                Some('A') => out.push_str(weekday),
                Some('H') => out.push_str(&format!("{:02}", self.hour)),
                Some('M') => out.push_str(&format!("{:02}", self.minute)),
                Some('S') => out.push_str(&format!("{:02}", self.second)),
                Some('F') => {
                    out.push_str(&format!("{}-{:02}-{:02}", self.year, self.month, self.day))
                }
                Some('%') => out.push('%'),
                Some(other) => {
                    out.push('%');
                    out.push(other);
                }
                None => out.push('%'),
            }
        }
        out
    }
}

/// Renders a Hugging Face chat template the way `transformers` does, for a conversation
/// without tools; see [`render_template`].
pub fn render_chat_template(
    template: &str,
    messages: &[ChatMessage],
    add_generation_prompt: bool,
    bos_token: &str,
    eos_token: &str,
    clock: &TemplateClock,
) -> Result<String> {
    let input = TemplateInput {
        messages,
        add_generation_prompt,
        bos_token,
        eos_token,
        ..TemplateInput::default()
    };
    render_template(template, &input, clock)
}

/// Renders a Hugging Face chat template the way `transformers` does: Jinja with
/// `trim_blocks` and `lstrip_blocks`, loop controls, Python string methods, Python's
/// `json.dumps` as `tojson`, and the `raise_exception` and `strftime_now` helpers, over the
/// variables of [`template_variables`]. `strftime_now` tells the time of `clock`, read once
/// per render.
pub fn render_template(
    template: &str,
    input: &TemplateInput,
    clock: &TemplateClock,
) -> Result<String> {
    use minijinja::{Environment, Error, ErrorKind};
    let err = |e: Error| TextError::ChatTemplate(e.to_string());
    let mut env = Environment::new();
    env.set_syntax(
        minijinja::syntax::SyntaxConfig::builder()
            .trim_blocks(true)
            .lstrip_blocks(true)
            .build()
            .map_err(err)?,
    );
    env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
    env.add_filter("tojson", crate::template_json::tojson);
    env.add_function("raise_exception", |msg: String| -> Result<String, Error> {
        Err(Error::new(ErrorKind::InvalidOperation, msg))
    });
    let now = clock.now();
    env.add_function("strftime_now", move |format: String| -> String {
        now.strftime(&format)
    });
    let template = without_generation_tags(template);
    env.add_template("chat", &template).map_err(err)?;
    let tpl = env.get_template("chat").map_err(err)?;
    let variables: minijinja::Value = serde_json::from_str(&template_variables(input))
        .map_err(|e| TextError::ChatTemplate(e.to_string()))?;
    tpl.render(variables).map_err(err)
}

/// The variables a template is rendered with, as a JSON object (keys in order): `messages`,
/// `tools` when tools are offered, `add_generation_prompt`, `bos_token`, `eos_token`, and
/// `enable_thinking` and `reasoning_effort` when set. Reference renderers (the tests' jinja2)
/// take exactly this text, so that both see the same input.
///
/// The thinking switch goes in under both names families read it by: `enable_thinking`
/// (Qwen3, GLM, SmolLM3) and `thinking` (DeepSeek V3.1 and later, whose published templates
/// read only `thinking`; llama.cpp's copies map one onto the other).
///
/// Without tools, `tools` is left undefined, where `transformers` passes `None`: jinja2
/// renders both the same for every template llama.cpp ships except three `tool_use`-only
/// templates that refuse `None` (Hermes 2 Pro, Hermes 3, Command R+), and minijinja, unlike
/// jinja2, iterates `none` as empty and calls it iterable, so an undefined `tools` is what
/// renders byte-identically everywhere else.
pub fn template_variables(input: &TemplateInput) -> String {
    #[derive(serde::Serialize)]
    struct Function<'a> {
        name: &'a str,
        #[serde(skip_serializing_if = "Option::is_none")]
        description: Option<&'a str>,
        #[serde(skip_serializing_if = "Option::is_none")]
        parameters: Option<Json<'a>>,
    }
    #[derive(serde::Serialize)]
    struct Tool<'a> {
        #[serde(rename = "type")]
        kind: &'a str,
        function: Function<'a>,
    }
    #[derive(serde::Serialize)]
    struct Call<'a> {
        name: &'a str,
        arguments: Json<'a>,
    }
    #[derive(serde::Serialize)]
    struct CallItem<'a> {
        id: &'a str,
        #[serde(rename = "type")]
        kind: &'a str,
        function: Call<'a>,
    }
    /// A message's content: its text, or for a message with images a list of parts, each
    /// image (`{"type": "image"}`, shown before the text as mlx-vlm orders them) then the
    /// text (`{"type": "text", "text"}`), as multimodal templates read it.
    #[derive(serde::Serialize)]
    #[serde(untagged)]
    enum Content<'a> {
        Text(&'a str),
        Parts(Vec<Part<'a>>),
    }
    #[derive(serde::Serialize)]
    #[serde(tag = "type", rename_all = "lowercase")]
    enum Part<'a> {
        Image,
        Text { text: &'a str },
    }
    #[derive(serde::Serialize)]
    struct Message<'a> {
        role: &'a str,
        content: Content<'a>,
        #[serde(skip_serializing_if = "Vec::is_empty")]
        tool_calls: Vec<CallItem<'a>>,
        #[serde(skip_serializing_if = "Option::is_none")]
        tool_call_id: Option<&'a str>,
        #[serde(skip_serializing_if = "Option::is_none")]
        name: Option<&'a str>,
    }
    #[derive(serde::Serialize)]
    struct Variables<'a> {
        messages: Vec<Message<'a>>,
        #[serde(skip_serializing_if = "Option::is_none")]
        tools: Option<Vec<Tool<'a>>>,
        add_generation_prompt: bool,
        bos_token: &'a str,
        eos_token: &'a str,
        #[serde(skip_serializing_if = "Option::is_none")]
        enable_thinking: Option<bool>,
        #[serde(skip_serializing_if = "Option::is_none")]
        thinking: Option<bool>,
        #[serde(skip_serializing_if = "Option::is_none")]
        reasoning_effort: Option<&'a str>,
    }
    let variables = Variables {
        messages: input
            .messages
            .iter()
            .map(|m| Message {
                role: &m.role,
                content: if m.images.is_empty() {
                    Content::Text(&m.content)
                } else {
                    Content::Parts(
                        m.images
                            .iter()
                            .map(|_| Part::Image)
                            .chain(
                                (!m.content.is_empty()).then_some(Part::Text { text: &m.content }),
                            )
                            .collect(),
                    )
                },
                tool_calls: m
                    .tool_calls
                    .iter()
                    .map(|c| CallItem {
                        id: &c.id,
                        kind: "function",
                        function: Call {
                            name: &c.name,
                            arguments: Json(&c.arguments),
                        },
                    })
                    .collect(),
                tool_call_id: m.tool_call_id.as_deref(),
                name: m.name.as_deref(),
            })
            .collect(),
        tools: input.tools.map(|tools| {
            tools
                .iter()
                .map(|t| Tool {
                    kind: "function",
                    function: Function {
                        name: &t.name,
                        description: t.description.as_deref(),
                        parameters: t.parameters.as_deref().map(Json),
                    },
                })
                .collect()
        }),
        add_generation_prompt: input.add_generation_prompt,
        bos_token: input.bos_token,
        eos_token: input.eos_token,
        enable_thinking: input.enable_thinking,
        thinking: input.enable_thinking,
        reasoning_effort: input.reasoning_effort,
    };
    serde_json::to_string(&variables).unwrap_or_default()
}

/// JSON text written into the variables as the value it spells (keys in the order written);
/// text that is not JSON is written as a string.
struct Json<'a>(&'a str);

impl serde::Serialize for Json<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        match serde_json::from_str::<minijinja::Value>(self.0) {
            Ok(value) => serde::Serialize::serialize(&value, s),
            Err(_) => s.serialize_str(self.0),
        }
    }
}

/// `transformers` adds a `{% generation %}...{% endgeneration %}` block to Jinja (it marks the
/// assistant's tokens for training masks and renders its body unchanged). minijinja has no
/// custom tags, so each becomes an `if true`/`endif` pair with the same whitespace-control
/// markers, which renders identically.
fn without_generation_tags(template: &str) -> std::borrow::Cow<'_, str> {
    if !template.contains("generation") {
        return template.into();
    }
    let mut out = String::with_capacity(template.len());
    let mut rest = template;
    while let Some(start) = rest.find("{%") {
        out.push_str(&rest[..start]);
        let tag = &rest[start..];
        let Some(len) = tag.find("%}").map(|end| end + 2) else {
            break;
        };
        let inner = &tag[2..len - 2];
        let open = if inner.starts_with(['-', '+']) {
            &inner[..1]
        } else {
            ""
        };
        let close = if inner.ends_with(['-', '+']) {
            &inner[inner.len() - 1..]
        } else {
            ""
        };
        let word = inner[open.len()..inner.len() - close.len()].trim();
        match word {
            "generation" => out.push_str(&format!("{{%{open} if true {close}%}}")),
            "endgeneration" => out.push_str(&format!("{{%{open} endif {close}%}}")),
            _ => out.push_str(&tag[..len]),
        }
        rest = &tag[len..];
    }
    out.push_str(rest);
    out.into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_thinking_switch_reaches_templates_under_both_names() {
        // DeepSeek V3.1's published template reads `thinking`, Qwen3's `enable_thinking`.
        let template = "{% if thinking %}<think>{% endif %}|{% if enable_thinking %}on{% endif %}\
                        |{% if thinking is defined %}set{% endif %}";
        let render = |enable_thinking| {
            let input = TemplateInput {
                messages: &[],
                tools: None,
                add_generation_prompt: true,
                enable_thinking,
                reasoning_effort: None,
                bos_token: "",
                eos_token: "",
            };
            render_template(template, &input, &TemplateClock::default()).unwrap()
        };
        assert_eq!(render(Some(true)), "<think>|on|set");
        assert_eq!(render(Some(false)), "||set");
        assert_eq!(render(None), "||");
    }

    #[test]
    fn generation_blocks_become_plain_blocks() {
        let t = "a {%- generation -%} b {{ x }} {%- endgeneration %} c {% if y %}{% endif %}";
        assert_eq!(
            without_generation_tags(t),
            "a {%- if true -%} b {{ x }} {%- endif %} c {% if y %}{% endif %}"
        );
        assert_eq!(without_generation_tags("{% generation"), "{% generation");
    }

    #[test]
    fn dates_format_like_strftime() {
        let new_year = DateTime::midnight(2025, 1, 1);
        assert_eq!(new_year.strftime("%d %b %Y"), "01 Jan 2025");
        assert_eq!(new_year.strftime("%Y-%m-%d"), "2025-01-01");
        assert_eq!(new_year.strftime("%B %d, %Y"), "January 01, 2025");
        assert_eq!(
            new_year.strftime("%A %H:%M:%S 100%% %q %"),
            "Wednesday 00:00:00 100% %q %"
        );
        let leap = DateTime::from_unix_seconds(1_709_210_096); // 2024-02-29 12:34:56 UTC
        assert_eq!(
            leap,
            DateTime {
                hour: 12,
                minute: 34,
                second: 56,
                ..DateTime::midnight(2024, 2, 29)
            }
        );
        assert_eq!(
            leap.strftime("%a %e %h %y, day %j, %F %H:%M:%S"),
            "Thu 29 Feb 24, day 060, 2024-02-29 12:34:56"
        );
    }

    #[test]
    fn unix_seconds_and_civil_days_agree() {
        assert_eq!(
            DateTime::from_unix_seconds(0),
            DateTime::midnight(1970, 1, 1)
        );
        assert_eq!(DateTime::from_unix_seconds(-1).year, 1969);
        // Every day from 1900 to 2200 maps back to its day count.
        for days in -25_567..84_000i64 {
            let d = DateTime::from_unix_seconds(days * 86_400 + 3_599);
            assert_eq!(d.days_since_epoch(), days);
            assert_eq!((d.hour, d.minute, d.second), (0, 59, 59));
        }
        assert_eq!(DateTime::midnight(2000, 3, 1).days_since_epoch(), 11_017);
    }

    #[test]
    fn a_fixed_clock_stays_put() {
        let at = DateTime::midnight(2025, 1, 1);
        assert_eq!(TemplateClock::Fixed(at).now(), at);
        assert_eq!(TemplateClock::default(), TemplateClock::SystemUtc);
        let now = TemplateClock::SystemUtc.now();
        assert!(now.year >= 2025, "{now:?}");
    }
}
