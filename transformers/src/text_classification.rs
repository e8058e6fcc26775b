//! Text classification as transformers' `text-classification` pipeline does it
//! (`TextClassificationPipeline`): a sequence classifier of any family (BERT's, RoBERTa's,
//! DistilBERT's, ModernBERT's, a decoder's `*ForSequenceClassification`) scores each text,
//! and its logits become each label's score through the pipeline's function: a sigmoid for
//! one label or a multi-label classifier (`problem_type`), a softmax otherwise.

use crate::auto::LoadOptions;
use crate::kinds::Encoder;
use crate::sentence::{classifier_logits, max_length_of, pad_id_of, Classifier};
use crate::tokenizer::PairTruncation;
use crate::vision::Scored;
use crate::{Error, Result, Tokenizer};

/// What turns a text classifier's logits into scores (transformers'
/// `ClassificationFunction`, the pipeline's `function_to_apply`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ClassificationFunction {
    /// Each label on its own, `1 / (1 + e^-x)`: one label, or `problem_type`
    /// `"multi_label_classification"`.
    Sigmoid,
    /// Over the labels: the default for several.
    Softmax,
    /// The raw logits.
    None,
}

impl ClassificationFunction {
    /// The function of `name` (`sigmoid`, `softmax`, `none`), as the pipeline's
    /// `function_to_apply` names them.
    pub fn from_name(name: &str) -> Option<ClassificationFunction> {
        match name {
            "sigmoid" => Some(ClassificationFunction::Sigmoid),
            "softmax" => Some(ClassificationFunction::Softmax),
            "none" => Some(ClassificationFunction::None),
            _ => None,
        }
    }

    /// Its name.
    pub fn name(self) -> &'static str {
        match self {
            ClassificationFunction::Sigmoid => "sigmoid",
            ClassificationFunction::Softmax => "softmax",
            ClassificationFunction::None => "none",
        }
    }

    /// One row of logits as scores.
    fn apply(self, row: &[f32]) -> Vec<f32> {
        match self {
            ClassificationFunction::Sigmoid => {
                row.iter().map(|&x| 1.0 / (1.0 + (-x).exp())).collect()
            }
            ClassificationFunction::Softmax => {
                let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                let e: Vec<f32> = row.iter().map(|&x| (x - max).exp()).collect();
                let sum: f32 = e.iter().sum();
                e.iter().map(|&x| x / sum).collect()
            }
            ClassificationFunction::None => row.to_vec(),
        }
    }
}

/// A sequence classifier with its tokenizer, scoring texts as the `text-classification`
/// pipeline does.
#[derive(Debug)]
pub struct TextClassifier {
    model: Box<dyn Encoder>,
    tokenizer: Tokenizer,
    labels: Vec<String>,
    function: ClassificationFunction,
    max_length: usize,
    pad_id: i64,
}

impl TextClassifier {
    /// Loads the sequence-classification checkpoint `repo_or_path` (a folder, file or repo
    /// id) with its tokenizer; its labels are `id2label`'s, its function the pipeline's
    /// default for its `problem_type` and label count.
    pub fn load_pretrained(repo_or_path: &str, opts: LoadOptions) -> Result<TextClassifier> {
        let Classifier {
            model,
            tokenizer,
            labels,
            config,
            pretrained,
        } = Classifier::load(repo_or_path, &opts)?;
        let multi_label = config
            .get("problem_type")
            .is_some_and(|v| v.as_str() == Some("multi_label_classification"));
        let function = if multi_label || labels.len() == 1 {
            ClassificationFunction::Sigmoid
        } else {
            ClassificationFunction::Softmax
        };
        Ok(TextClassifier {
            max_length: max_length_of(&pretrained, model.as_ref())?,
            pad_id: pad_id_of(&tokenizer, &config),
            model,
            tokenizer,
            labels,
            function,
        })
    }

    /// Overrides the function (the pipeline's `function_to_apply`).
    pub fn with_function(mut self, function: ClassificationFunction) -> TextClassifier {
        self.function = function;
        self
    }

    /// The function in use.
    pub fn function(&self) -> ClassificationFunction {
        self.function
    }

    /// The labels, by index.
    pub fn labels(&self) -> &[String] {
        &self.labels
    }

    /// The most tokens a text takes (with `truncate`, the most it is cut to).
    pub fn max_length(&self) -> usize {
        self.max_length
    }

    /// Every label of each text with its score, best first (the pipeline with
    /// `top_k=None`). A text longer than [`TextClassifier::max_length`] tokens is refused
    /// unless `truncate` cuts it there (the pipeline's `truncation=True`).
    pub fn classify(&self, texts: &[&str], truncate: bool) -> Result<Vec<Vec<Scored>>> {
        let inputs: Vec<TextInput> = texts.iter().map(|t| TextInput::Text(t)).collect();
        let cut = truncate.then_some(self.max_length);
        Ok(self.classify_with(&inputs, cut, self.function)?.0)
    }

    /// [`TextClassifier::classify`] of texts or pairs of texts (the pipeline's
    /// `{"text", "text_pair"}`: one input with the tokenizer's separators), each cut to at
    /// most `truncate` tokens where given (a pair longest first; never past the model's
    /// length), the logits through `function`; also the tokens read.
    pub fn classify_with(
        &self,
        inputs: &[TextInput],
        truncate: Option<usize>,
        function: ClassificationFunction,
    ) -> Result<(Vec<Vec<Scored>>, usize)> {
        if inputs.is_empty() {
            return Err(Error::invalid("texts", "no text given".into()));
        }
        let limit = truncate.map_or(usize::MAX, |n| n.min(self.max_length));
        let encoded = inputs
            .iter()
            .map(|input| match *input {
                TextInput::Text(t) if truncate.is_some() => {
                    Ok((self.tokenizer.encode_truncated(t, limit)?, None))
                }
                TextInput::Text(t) => Ok((self.tokenizer.encode(t, true)?, None)),
                TextInput::Pair(a, b) => {
                    let e =
                        self.tokenizer
                            .encode_pair(a, b, limit, PairTruncation::LongestFirst)?;
                    Ok((e.ids, Some(e.type_ids)))
                }
            })
            .collect::<Result<Vec<_>>>()?;
        if let Some((i, (long, _))) = encoded
            .iter()
            .enumerate()
            .find(|(_, (ids, _))| ids.len() > self.max_length)
        {
            return Err(Error::invalid(
                "texts",
                format!(
                    "text {i} is {} tokens; the model takes {} (truncate it)",
                    long.len(),
                    self.max_length
                ),
            ));
        }
        // A single text is one segment: every token type 0.
        let zeros: Vec<Vec<u32>> = encoded.iter().map(|(i, _)| vec![0; i.len()]).collect();
        let rows: Vec<(&[u32], &[u32])> = encoded
            .iter()
            .zip(&zeros)
            .map(|((ids, types), z)| (ids.as_slice(), types.as_deref().unwrap_or(z)))
            .collect();
        let tokens = rows.iter().map(|(ids, _)| ids.len()).sum();
        let logits = classifier_logits(self.model.as_ref(), self.pad_id, &rows)?;
        let scored = logits
            .chunks(self.labels.len().max(1))
            .map(|row| {
                let mut scored: Vec<Scored> = function
                    .apply(row)
                    .into_iter()
                    .zip(&self.labels)
                    .map(|(score, label)| Scored {
                        label: label.clone(),
                        score,
                    })
                    .collect();
                scored.sort_by(|a, b| b.score.total_cmp(&a.score));
                scored
            })
            .collect();
        Ok((scored, tokens))
    }
}

/// One input of a text classifier: a text, or a pair read as one input.
#[derive(Clone, Copy, Debug)]
pub enum TextInput<'a> {
    Text(&'a str),
    Pair(&'a str, &'a str),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn functions_score_as_the_pipeline() {
        let row = [1.0f32, 2.0, 3.0];
        let soft = ClassificationFunction::Softmax.apply(&row);
        assert!((soft.iter().sum::<f32>() - 1.0).abs() < 1e-6);
        assert!((soft[2] - 0.665_240_9).abs() < 1e-6);
        let sig = ClassificationFunction::Sigmoid.apply(&row);
        assert!((sig[0] - 0.731_058_6).abs() < 1e-6);
        assert_eq!(ClassificationFunction::None.apply(&row), row);
        assert_eq!(
            ClassificationFunction::from_name("softmax"),
            Some(ClassificationFunction::Softmax)
        );
        assert_eq!(ClassificationFunction::from_name("argmax"), None);
    }
}
