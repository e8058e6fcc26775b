//! Arbitrary bytes as a chat template (as `tokenizer_config.json` or a GGUF carries it): it
//! compiles or errors, and renders conversations (system, alternating roles, empty) or
//! errors, within the renderer's fuel, never panicking or hanging.
#![no_main]

use libfuzzer_sys::fuzz_target;
use zoo_transformers::{ChatTemplate, Message};

fuzz_target!(|data: &[u8]| {
    let source = String::from_utf8_lossy(data);
    let Ok(t) = ChatTemplate::new(&source, Some("<s>"), Some("</s>")) else {
        return;
    };
    let chats = [
        vec![Message::new("user", "What is the capital of France?")],
        vec![
            Message::new("system", "Be brief."),
            Message::new("user", "hi"),
            Message::new("assistant", "hello"),
            Message::new("user", "{{ 7*7 }} {% raw %}"),
        ],
        vec![],
    ];
    for chat in &chats {
        let _ = t.apply(chat, true);
        let _ = t.apply(chat, false);
    }
});
