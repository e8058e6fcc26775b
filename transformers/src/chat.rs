//! Chat templates rendered the way transformers' `apply_chat_template` renders them: Jinja
//! (minijinja) with `trim_blocks` and `lstrip_blocks`, the variables `messages`, `tools`,
//! `add_generation_prompt`, the special tokens (`bos_token`, `eos_token`, ...), the function
//! `raise_exception`, and Python string methods (`.strip()`, `.startswith()`, ...).

use minijinja::{Environment, ErrorKind, Value};
use serde::Serialize;

use crate::{Error, Result};

mod limits;
mod namespaces;
use limits::{template_fuel, BoundedOutput, STACK_PER_FUEL};

/// One chat message.
#[derive(Clone, Debug, PartialEq)]
pub struct Message {
    /// `system`, `user`, `assistant`, ...
    pub role: String,
    /// The message text.
    pub content: String,
    /// Images the message shows before its text (a vision-language chat turn).
    pub images: usize,
}

impl Message {
    /// A message with `role` and `content`.
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Message {
        Message {
            role: role.into(),
            content: content.into(),
            images: 0,
        }
    }

    /// The same message showing `images` images before its text.
    pub fn with_images(self, images: usize) -> Message {
        Message { images, ..self }
    }
}

/// A message as templates read it: `content` a string, or with images the list of parts
/// vision-language templates iterate (`{"type": "image"}` each, then
/// `{"type": "text", "text": ...}`), as transformers' processors pass them.
impl Serialize for Message {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        // A struct, so that templates see `role` then `content` (a map's keys would sort).
        use serde::ser::SerializeStruct;
        let mut m = s.serialize_struct("Message", 2)?;
        m.serialize_field("role", &self.role)?;
        if self.images == 0 {
            m.serialize_field("content", &self.content)?;
        } else {
            let mut parts: Vec<serde_json::Value> =
                vec![serde_json::json!({"type": "image"}); self.images];
            parts.push(serde_json::json!({"type": "text", "text": self.content}));
            m.serialize_field("content", &parts)?;
        }
        m.end()
    }
}

/// A compiled chat template and the special tokens it may use.
#[derive(Debug)]
pub struct ChatTemplate {
    env: Environment<'static>,
    bos_token: String,
    eos_token: String,
    extra_tokens: Vec<(String, String)>,
}

/// Runs `f` (parsing a template) with at least 2 MiB of stack, on a new 4 MiB segment when
/// the caller's thread has less left. minijinja parses up to 150 levels of nesting by
/// recursion, and compiles and drops the tree the same way: a release build spent more than
/// 256 KiB on 140 nested `if` blocks, which overflowed an app's small worker thread.
fn with_stack<T>(f: impl FnOnce() -> T) -> T {
    stacker::maybe_grow(2 << 20, 4 << 20, f)
}

impl ChatTemplate {
    /// Compiles `source` (a template from `tokenizer_config.json` or a GGUF file).
    pub fn new(
        source: &str,
        bos_token: Option<&str>,
        eos_token: Option<&str>,
    ) -> Result<ChatTemplate> {
        let mut env = Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function(
            "raise_exception",
            |msg: String| -> std::result::Result<Value, minijinja::Error> {
                Err(minijinja::Error::new(ErrorKind::InvalidOperation, msg))
            },
        );
        env.add_filter("pprint", limits::pprint);
        env.add_filter("tojson", limits::tojson);
        env.add_function("strftime_now", |fmt: String| -> String {
            // Templates use it for "today's date" lines; a fixed, documented date keeps
            // rendering deterministic.
            fmt.replace("%Y", "2026")
                .replace("%m", "01")
                .replace("%d", "01")
                .replace("%B", "January")
                .replace("%b", "Jan")
        });
        with_stack(|| namespaces::check(source))
            .map_err(|e| Error::ChatTemplate(format!("the template is refused: {e}")))?;
        with_stack(|| env.add_template_owned("chat", source.to_string()))
            .map_err(|e| Error::ChatTemplate(format!("the template does not compile: {e}")))?;
        Ok(ChatTemplate {
            env,
            bos_token: bos_token.unwrap_or_default().to_string(),
            eos_token: eos_token.unwrap_or_default().to_string(),
            extra_tokens: Vec::new(),
        })
    }

    /// The template of a model, from `tokenizer_config.json` (or the GGUF metadata).
    pub fn from_tokenizer_config(config: &zoo_hub::TokenizerConfig) -> Result<ChatTemplate> {
        let source = config.template(None).ok_or_else(|| {
            Error::ChatTemplate(
                "this model has no chat template (tokenizer_config.json `chat_template` or chat_template.jinja); \
                 use a plain prompt instead of --chat"
                    .into(),
            )
        })?;
        let mut t = ChatTemplate::new(
            source,
            config.bos_token.as_ref().map(|t| t.content()),
            config.eos_token.as_ref().map(|t| t.content()),
        )?;
        for (name, tok) in [
            ("unk_token", &config.unk_token),
            ("pad_token", &config.pad_token),
        ] {
            if let Some(tok) = tok {
                t.extra_tokens
                    .push((name.to_string(), tok.content().to_string()));
            }
        }
        Ok(t)
    }

    /// Renders `messages`, ending with the assistant's turn header when
    /// `add_generation_prompt`.
    ///
    /// The template is untrusted input and its render is bounded: an [`Error::ChatTemplate`]
    /// when it raises, runs past its budget of 50 000 instructions plus 500 per message,
    /// writes more than 64 MiB, or asks `pprint`/`tojson` for a layout past 64 MiB of work.
    pub fn apply(&self, messages: &[Message], add_generation_prompt: bool) -> Result<String> {
        if messages.is_empty() {
            return Err(Error::ChatTemplate("no messages to render".into()));
        }
        // A template is user input: its work is bounded (a runaway loop errors instead of
        // hanging), and so is the nesting of the values it builds, through the stack below.
        let fuel = template_fuel(messages.len());
        let mut env = self.env.clone();
        env.set_fuel(Some(fuel));
        let tmpl = env
            .get_template("chat")
            .map_err(|e| Error::ChatTemplate(e.to_string()))?;
        let mut ctx = std::collections::BTreeMap::new();
        ctx.insert("messages".to_string(), Value::from_serialize(messages));
        ctx.insert(
            "add_generation_prompt".to_string(),
            Value::from(add_generation_prompt),
        );
        ctx.insert("tools".to_string(), Value::from(()));
        ctx.insert("documents".to_string(), Value::from(()));
        ctx.insert("bos_token".to_string(), Value::from(self.bos_token.clone()));
        ctx.insert("eos_token".to_string(), Value::from(self.eos_token.clone()));
        for (k, v) in &self.extra_tokens {
            ctx.insert(k.clone(), Value::from(v.clone()));
        }
        // The render runs on its own thread with a stack for the deepest value its fuel can
        // build, so nothing a template does overflows the caller's stack (a small worker
        // thread's included).
        let stack = usize::try_from(fuel * STACK_PER_FUEL).unwrap_or(usize::MAX);
        let rendered = std::thread::scope(|scope| {
            let worker = std::thread::Builder::new()
                .name("chat-template".into())
                .stack_size(stack)
                .spawn_scoped(scope, || {
                    let mut out = BoundedOutput(Vec::new());
                    tmpl.render_captured_to(ctx, &mut out)?;
                    Ok::<_, minijinja::Error>(out.0)
                })
                .map_err(|e| {
                    Error::ChatTemplate(format!(
                        "could not start a thread with {} MiB of stack to render the template: {e}",
                        stack >> 20
                    ))
                })?;
            worker
                .join()
                .map_err(|_| Error::ChatTemplate("rendering the template panicked".into()))
        })?;
        let bytes = rendered.map_err(|e| {
            let mut msg = e.to_string();
            let mut src = std::error::Error::source(&e);
            while let Some(s) = src {
                msg.push_str(&format!(": {s}"));
                src = s.source();
            }
            Error::ChatTemplate(msg)
        })?;
        String::from_utf8(bytes)
            .map_err(|e| Error::ChatTemplate(format!("the rendered prompt is not UTF-8: {e}")))
    }
}
