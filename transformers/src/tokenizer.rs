//! Tokenizers from `tokenizer.json` (or the one a GGUF file's vocabulary describes), through
//! the `tokenizers` crate, plus incremental decoding for streaming.

use serde_json::Value;

use crate::{Error, Result};

/// Refuses a `TemplateProcessing` post-processor (alone or inside a `Sequence`) whose
/// templates name a special token its `special_tokens` map does not define: the `tokenizers`
/// crate reads such a file and then panics on the first encode. The crate reads a
/// post-processor by its fields when `type` is missing or misspelt, and a template as pieces
/// or as strings (`"[CLS] $A:0 [SEP]"`), so every form is checked, whatever `type` says.
fn check_templates(p: &Value) -> Result<()> {
    if let Some(inner) = p.get("processors").and_then(Value::as_array) {
        inner.iter().try_for_each(check_templates)?;
    }
    let defined = p.get("special_tokens").and_then(Value::as_object);
    for which in ["single", "pair"] {
        let Some(template) = p.get(which) else {
            continue;
        };
        let mut ids: Vec<&str> = Vec::new();
        let strings: Vec<&str> = match template {
            Value::String(t) => t.split_whitespace().collect(),
            Value::Array(items) => items
                .iter()
                .filter_map(|piece| match piece {
                    Value::String(t) => Some(t.as_str()),
                    _ => None,
                })
                .collect(),
            _ => Vec::new(),
        };
        for piece in strings {
            // `$A`, `$B:1`, `$0` are sequences; anything else names a special token, with an
            // optional `:type_id`.
            if !piece.starts_with('$') {
                ids.push(piece.split_once(':').map_or(piece, |(id, _)| id));
            }
        }
        if let Value::Array(items) = template {
            ids.extend(
                items
                    .iter()
                    .filter_map(|piece| piece.pointer("/SpecialToken/id").and_then(Value::as_str)),
            );
        }
        if let Some(id) = ids
            .into_iter()
            .find(|id| !defined.is_some_and(|d| d.contains_key(*id)))
        {
            return Err(Error::Tokenizer(format!(
                "tokenizer.json: post_processor.{which} uses the special token {id:?}, \
                 which post_processor.special_tokens does not define; fix the file or \
                 re-save the tokenizer with transformers"
            )));
        }
    }
    Ok(())
}

/// How [`Tokenizer::encode_pair`] cuts a pair longer than its `max_length`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PairTruncation {
    /// Only the second text loses its last tokens (a question-answering context).
    OnlySecond,
    /// The longer text loses tokens first, then both alike (a cross-encoder's query and
    /// document; transformers' default).
    LongestFirst,
}

/// Two texts encoded as one input ([`Tokenizer::encode_pair`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PairEncoding {
    /// Token ids, special tokens included.
    pub ids: Vec<u32>,
    /// Segment ids (`token_type_ids`: 0 for the first text, 1 for the second, as the
    /// tokenizer's post-processor assigns them).
    pub type_ids: Vec<u32>,
    /// Each token's byte range in the text it came from (`(0, 0)` for special tokens).
    pub offsets: Vec<(usize, usize)>,
    /// Which text each token came from (`Some(0)`, `Some(1)`), `None` for special tokens.
    pub sequence_ids: Vec<Option<usize>>,
}

/// A model's tokenizer and its special tokens.
#[derive(Clone)]
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Tokenizer(vocab {})", self.vocab_size())
    }
}

impl Tokenizer {
    /// Builds a tokenizer from the JSON of a `tokenizer.json` file.
    pub fn from_json(json: &Value) -> Result<Tokenizer> {
        if let Some(p) = json.get("post_processor") {
            check_templates(p)?;
        }
        let text = serde_json::to_string(json).map_err(|e| Error::Tokenizer(e.to_string()))?;
        let mut inner = text
            .parse::<tokenizers::Tokenizer>()
            .map_err(|e| Error::Tokenizer(format!("tokenizer.json cannot be read: {e}")))?;
        // transformers ignores the padding and truncation a tokenizer.json may carry and
        // applies only what the caller asks (all-MiniLM-L6-v2's pads every text to 128).
        inner.with_padding(None);
        inner
            .with_truncation(None)
            .map_err(|e| Error::Tokenizer(format!("tokenizer.json cannot be read: {e}")))?;
        Ok(Tokenizer { inner })
    }

    /// The tokenizer of a model folder, repo or GGUF file.
    pub fn from_pretrained(pretrained: &zoo_hub::Pretrained) -> Result<Tokenizer> {
        match pretrained.tokenizer_json()? {
            Some(json) => Tokenizer::from_json(&json),
            None => Err(Error::NoTokenizer {
                source_name: pretrained.files().source().to_string(),
            }),
        }
    }

    /// Token ids of `text`; `add_special_tokens` adds what the tokenizer's post-processor adds
    /// (a BOS for Llama), as transformers does for plain prompts but not for chat templates.
    pub fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>> {
        let enc = self
            .inner
            .encode(text, add_special_tokens)
            .map_err(|e| Error::Tokenizer(format!("encoding failed: {e}")))?;
        Ok(enc.get_ids().to_vec())
    }

    /// Token ids of `text` with the tokenizer's special tokens, at most `max_length` of them:
    /// longer texts lose their last tokens and keep the special ones, as transformers'
    /// `truncation=True, max_length=...` does.
    pub fn encode_truncated(&self, text: &str, max_length: usize) -> Result<Vec<u32>> {
        let fail = |e: tokenizers::Error| Error::Tokenizer(format!("encoding failed: {e}"));
        let mut enc = self.inner.encode(text, false).map_err(fail)?;
        let added = self
            .inner
            .get_post_processor()
            .map_or(0, |p| tokenizers::PostProcessor::added_tokens(p, false));
        if max_length <= added {
            return Err(Error::Tokenizer(format!(
                "max_length {max_length} leaves no room beside the {added} special tokens"
            )));
        }
        enc.truncate(
            max_length - added,
            0,
            tokenizers::TruncationDirection::Right,
        );
        let enc = self.inner.post_process(enc, None, true).map_err(fail)?;
        Ok(enc.get_ids().to_vec())
    }

    /// A pair of texts as one input with the tokenizer's special tokens (BERT's
    /// `[CLS] first [SEP] second [SEP]`), at most `max_length` tokens, a longer pair cut as
    /// `truncation` says (transformers' `truncation="only_second"` for question answering,
    /// `"longest_first"` — its `truncation=True` — for cross-encoders).
    pub fn encode_pair(
        &self,
        first: &str,
        second: &str,
        max_length: usize,
        truncation: PairTruncation,
    ) -> Result<PairEncoding> {
        use tokenizers::utils::truncation::{
            truncate_encodings, TruncationDirection, TruncationParams, TruncationStrategy,
        };
        let fail = |e: tokenizers::Error| Error::Tokenizer(format!("encoding failed: {e}"));
        let a = self.inner.encode(first, false).map_err(fail)?;
        let b = self.inner.encode(second, false).map_err(fail)?;
        let added = self
            .inner
            .get_post_processor()
            .map_or(0, |p| tokenizers::PostProcessor::added_tokens(p, true));
        let room = max_length.saturating_sub(added);
        let fits = match truncation {
            PairTruncation::OnlySecond => room > a.len(),
            PairTruncation::LongestFirst => room >= 2,
        };
        if !fits {
            return Err(Error::Tokenizer(format!(
                "max_length {max_length} leaves no room for the pair beside {added} special tokens{}",
                match truncation {
                    PairTruncation::OnlySecond =>
                        format!(" and the first text's {} tokens; shorten the first text", a.len()),
                    PairTruncation::LongestFirst => String::new(),
                }
            )));
        }
        let params = TruncationParams {
            direction: TruncationDirection::Right,
            max_length: room,
            strategy: match truncation {
                PairTruncation::OnlySecond => TruncationStrategy::OnlySecond,
                PairTruncation::LongestFirst => TruncationStrategy::LongestFirst,
            },
            stride: 0,
        };
        let (a, b) = truncate_encodings(a, Some(b), &params).map_err(fail)?;
        let enc = self.inner.post_process(a, b, true).map_err(fail)?;
        Ok(PairEncoding {
            ids: enc.get_ids().to_vec(),
            type_ids: enc.get_type_ids().to_vec(),
            offsets: enc.get_offsets().to_vec(),
            sequence_ids: enc.get_sequence_ids(),
        })
    }

    /// The id of the tokenizer's padding token, where its `tokenizer.json` names one.
    pub fn pad_id(&self) -> Option<u32> {
        self.inner.get_padding().map(|p| p.pad_id)
    }

    /// Text of `ids`, special tokens dropped when `skip_special_tokens`.
    pub fn decode(&self, ids: &[u32], skip_special_tokens: bool) -> Result<String> {
        self.inner
            .decode(ids, skip_special_tokens)
            .map_err(|e| Error::Tokenizer(format!("decoding failed: {e}")))
    }

    /// The id of a token string, if it is in the vocabulary.
    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    /// Vocabulary size, added tokens included.
    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    /// An incremental decoder for one sequence (see [`TextStream`]).
    pub fn stream(&self, skip_special_tokens: bool) -> TextStream<'_> {
        TextStream {
            tokenizer: self,
            ids: Vec::new(),
            emitted: 0,
            skip_special_tokens,
        }
    }
}

/// Turns tokens into text as they arrive. A character whose UTF-8 bytes span several byte-level
/// tokens decodes to U+FFFD until its last byte arrives, so text is held back while the decoded
/// tail is incomplete and released whole once it is not.
#[derive(Debug)]
pub struct TextStream<'a> {
    tokenizer: &'a Tokenizer,
    ids: Vec<u32>,
    /// Bytes of the decoded text already handed out.
    emitted: usize,
    skip_special_tokens: bool,
}

impl TextStream<'_> {
    /// Adds a token; returns the newly complete text (possibly empty).
    pub fn push(&mut self, id: u32) -> Result<String> {
        self.ids.push(id);
        let text = self.tokenizer.decode(&self.ids, self.skip_special_tokens)?;
        if text.ends_with('\u{FFFD}')
            || text.len() < self.emitted
            || !text.is_char_boundary(self.emitted)
        {
            return Ok(String::new());
        }
        let new = text[self.emitted..].to_string();
        self.emitted = text.len();
        Ok(new)
    }

    /// Whatever is still held back (an incomplete character at the very end), decoded as is.
    pub fn finish(&mut self) -> Result<String> {
        let text = self.tokenizer.decode(&self.ids, self.skip_special_tokens)?;
        let rest = if text.len() > self.emitted && text.is_char_boundary(self.emitted) {
            text[self.emitted..].to_string()
        } else {
            String::new()
        };
        self.emitted = text.len();
        Ok(rest)
    }

    /// All text decoded so far.
    pub fn text(&self) -> Result<String> {
        self.tokenizer.decode(&self.ids, self.skip_special_tokens)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn wordlevel(post_processor: Value) -> Value {
        json!({
            "version": "1.0",
            "added_tokens": [],
            "normalizer": null,
            "pre_tokenizer": {"type": "Whitespace"},
            "post_processor": post_processor,
            "decoder": null,
            "model": {"type": "WordLevel", "vocab": {"[UNK]": 0, "[CLS]": 1, "[SEP]": 2, "a": 3}, "unk_token": "[UNK]"},
        })
    }

    fn template(single_sep: &str) -> Value {
        json!({
            "type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": "[CLS]", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                       {"SpecialToken": {"id": single_sep, "type_id": 0}}],
            "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
            "special_tokens": {
                "[CLS]": {"id": "[CLS]", "ids": [1], "tokens": ["[CLS]"]},
                "[SEP]": {"id": "[SEP]", "ids": [2], "tokens": ["[SEP]"]},
            },
        })
    }

    #[test]
    fn a_template_naming_an_undefined_special_token_is_refused_at_load() {
        // Found by the tokenizer_json fuzz target: the tokenizers crate reads this file and
        // panics on the first encode (fuzz/regressions/tokenizer_json).
        let ok = Tokenizer::from_json(&wordlevel(template("[SEP]"))).unwrap();
        assert_eq!(ok.encode("a", true).unwrap(), [1, 3, 2]);
        let e = Tokenizer::from_json(&wordlevel(template("[S7EP]"))).unwrap_err();
        assert!(e.to_string().contains("\"[S7EP]\""), "{e}");
        let nested = json!({"type": "Sequence", "processors": [template("[X]")]});
        let e = Tokenizer::from_json(&wordlevel(nested)).unwrap_err();
        assert!(e.to_string().contains("post_processor.single"), "{e}");
        // Read by its fields when `type` is misspelt, and as string templates: both checked.
        let mut untyped = template("[ SEP]");
        untyped["typd"] = untyped["type"].take();
        let e = Tokenizer::from_json(&wordlevel(untyped)).unwrap_err();
        assert!(e.to_string().contains("\"[ SEP]\""), "{e}");
        let mut strings = template("[SEP]");
        strings["single"] = json!("[CLS] $A:0 [NOPE]:0");
        let e = Tokenizer::from_json(&wordlevel(strings)).unwrap_err();
        assert!(e.to_string().contains("\"[NOPE]\""), "{e}");
        let mut fine = template("[SEP]");
        fine["typd"] = fine["type"].take();
        let ok = Tokenizer::from_json(&wordlevel(fine)).unwrap();
        assert_eq!(ok.encode("a", true).unwrap(), [1, 3, 2]);
    }

    #[test]
    fn a_pair_keeps_the_first_text_and_cuts_the_second_to_max_length() {
        let mut bert = template("[SEP]");
        bert["pair"] = json!([
            {"SpecialToken": {"id": "[CLS]", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
            {"SpecialToken": {"id": "[SEP]", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}},
            {"SpecialToken": {"id": "[SEP]", "type_id": 1}},
        ]);
        let t = Tokenizer::from_json(&wordlevel(bert)).unwrap();
        let p = t
            .encode_pair("a a", "a a a a", 8, PairTruncation::OnlySecond)
            .unwrap();
        // [CLS] a a [SEP] + three of the second text's four + [SEP].
        assert_eq!(p.ids, [1, 3, 3, 2, 3, 3, 3, 2]);
        assert_eq!(p.type_ids, [0, 0, 0, 0, 1, 1, 1, 1]);
        assert_eq!(
            p.sequence_ids,
            [
                None,
                Some(0),
                Some(0),
                None,
                Some(1),
                Some(1),
                Some(1),
                None
            ]
        );
        // Byte ranges within each text.
        assert_eq!((p.offsets[2], p.offsets[6]), ((2, 3), (4, 5)));
        let e = t
            .encode_pair("a a a a a", "a", 8, PairTruncation::OnlySecond)
            .unwrap_err();
        assert!(e.to_string().contains("max_length 8"), "{e}");
        // Longest first: the longer text is cut first, the shorter one kept.
        let p = t
            .encode_pair("a a a a a", "a", 8, PairTruncation::LongestFirst)
            .unwrap();
        assert_eq!(p.type_ids, [0, 0, 0, 0, 0, 0, 1, 1]);
    }
}
