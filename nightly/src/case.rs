//! A parity case: one folder with `case.json`, a checkpoint, `inputs.safetensors` and
//! `expected.safetensors`. The format is documented in `nightly/README.md`.
//!
//! [`Case::load`] checks the folder against its own `case.json` (every listed tensor is
//! present with the declared shape and dtype, no tensor is unlisted, masks name real
//! inputs) so that a harness can trust a loaded case and a broken generator is caught
//! at load time, with the file and field named.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::metrics::{
    compare_close, compare_tokens, top1_agreement, CloseMetrics, MetricsError, PositionMask,
    TokenMetrics, Tolerance,
};
use crate::tensor::{read_safetensors, HostTensor, TensorFileError, TensorSet};

/// The `format_version` this crate reads.
pub const FORMAT_VERSION: u32 = 1;
/// File name of the case description inside a case folder.
pub const CASE_JSON: &str = "case.json";
/// File name of the inputs inside a case folder.
pub const INPUTS_FILE: &str = "inputs.safetensors";
/// File name of the reference outputs inside a case folder.
pub const EXPECTED_FILE: &str = "expected.safetensors";

/// Why a case folder could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum CaseError {
    /// A file or folder could not be read.
    #[error("cannot read {path}: {source}")]
    Io {
        /// The path.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// case.json is not valid JSON or does not match the schema.
    #[error("{path}: field `{field}`: {source} (see nightly/README.md for the case.json schema)")]
    Json {
        /// The case.json file.
        path: PathBuf,
        /// Path of the offending field, e.g. `outputs[2].compare` (`.` for the document).
        field: String,
        /// The parser's message.
        #[source]
        source: serde_json::Error,
    },
    /// case.json was written for a format this crate does not read.
    #[error("{path}: field `format_version` is {found}; this zoo reads version {supported}")]
    UnsupportedFormatVersion {
        /// The case.json file.
        path: PathBuf,
        /// The version found.
        found: u32,
        /// The version supported.
        supported: u32,
    },
    /// inputs.safetensors or expected.safetensors could not be read.
    #[error(transparent)]
    Tensors(#[from] TensorFileError),
    /// case.json lists a tensor the safetensors file lacks.
    #[error("{path}: field `{field}` names tensor `{name}`, which {file} does not contain")]
    MissingTensor {
        /// The case.json file.
        path: PathBuf,
        /// The field listing it, e.g. `outputs[0]`.
        field: String,
        /// The tensor.
        name: String,
        /// The safetensors file.
        file: PathBuf,
    },
    /// A safetensors file holds a tensor case.json does not describe.
    #[error(
        "{file} holds tensor `{name}`, which {path} does not list; every tensor needs an entry"
    )]
    UnlistedTensor {
        /// The case.json file.
        path: PathBuf,
        /// The safetensors file.
        file: PathBuf,
        /// The tensor.
        name: String,
    },
    /// A tensor's header disagrees with its case.json entry.
    #[error("{path}: field `{field}` declares {what} {declared} but the file has {found}")]
    Mismatch {
        /// The case.json file.
        path: PathBuf,
        /// The entry, e.g. `outputs[1].shape`.
        field: String,
        /// `shape` or `dtype`.
        what: &'static str,
        /// What case.json says.
        declared: String,
        /// What the safetensors header says.
        found: String,
    },
    /// An output's `compare` does not fit its dtype (exact on floats, allclose on ints).
    #[error("{path}: field `{field}`: compare `{compare}` cannot apply to a {dtype} tensor")]
    CompareKind {
        /// The case.json file.
        path: PathBuf,
        /// The entry, e.g. `outputs[3].compare`.
        field: String,
        /// The compare kind.
        compare: String,
        /// The tensor's stored dtype.
        dtype: String,
    },
    /// The case lists no output to compare (none, or only `info` entries): it would pass
    /// whatever the port computed.
    #[error("{path}: field `outputs`: no output is compared (none, or only `info` entries); list what the model must reproduce")]
    NothingToCompare {
        /// The case.json file.
        path: PathBuf,
    },
    /// An output's `mask` names no input or does not fit the output's shape.
    #[error("{path}: field `{field}`: {problem}")]
    BadMask {
        /// The case.json file.
        path: PathBuf,
        /// The entry, e.g. `outputs[0].mask`.
        field: String,
        /// What is wrong.
        problem: String,
    },
}

/// Why a port's output could not be compared with a case's reference.
#[derive(Debug, thiserror::Error)]
pub enum CompareError {
    /// The case has no output of that name.
    #[error("case `{case}` has no output `{name}`; it has: {available}")]
    UnknownOutput {
        /// The case.
        case: String,
        /// The name asked for.
        name: String,
        /// The outputs it has, comma-separated.
        available: String,
    },
    /// The port produced integers where floats are expected, or the reverse.
    #[error(
        "case `{case}`, output `{name}`: expected {expected} elements, the port produced {found}"
    )]
    ElementKind {
        /// The case.
        case: String,
        /// The output.
        name: String,
        /// `float` or `integer`.
        expected: &'static str,
        /// `float` or `integer`.
        found: &'static str,
    },
    /// Shapes or masks do not fit.
    #[error("case `{case}`, output `{name}`: {source}")]
    Metrics {
        /// The case.
        case: String,
        /// The output.
        name: String,
        /// The metrics error.
        #[source]
        source: MetricsError,
    },
}

/// What the case asks the model to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Task {
    /// Logits over the vocabulary, and greedy generation.
    CausalLm,
    /// Hidden states (encoders, base models).
    FeatureExtraction,
    /// Masked-token logits of an encoder head (`*ForMaskedLM`).
    FillMask,
    /// Per-sequence label logits (`*ForSequenceClassification`).
    TextClassification,
    /// Per-token label logits (`*ForTokenClassification`).
    TokenClassification,
    /// A span's per-token start and end logits (`*ForQuestionAnswering`).
    QuestionAnswering,
    /// One logit per choice of `[batch, choices, seq]` inputs (`*ForMultipleChoice`).
    MultipleChoice,
    /// Hidden states, pooled output or projected embeddings of a vision encoder.
    ImageFeatureExtraction,
    /// Per-image label logits (`*ForImageClassification`).
    ImageClassification,
    /// A contrastive image-text model's `logits_per_image` (`CLIPModel`).
    ZeroShotImageClassification,
    /// An encoder-decoder's encoder output, teacher-forced decoder logits and greedy
    /// generation (`T5ForConditionalGeneration`).
    #[serde(rename = "text2text-generation")]
    Text2TextGeneration,
    /// A vision-language model's logits over a prompt whose image tokens take the images'
    /// features, the projected features, and greedy generation (`LlavaForConditionalGeneration`).
    ImageTextToText,
}

/// The dtype the reference ran in and the checkpoint is stored in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CaseDtype {
    /// float32.
    F32,
    /// bfloat16.
    Bf16,
    /// float16.
    F16,
}

impl CaseDtype {
    /// The name used in case.json and on the command line (`f32`, `bf16`, `f16`).
    pub fn as_str(self) -> &'static str {
        match self {
            CaseDtype::F32 => "f32",
            CaseDtype::Bf16 => "bf16",
            CaseDtype::F16 => "f16",
        }
    }
}

/// How an output is judged.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CompareKind {
    /// Floats within the tolerance (torch.allclose).
    Allclose,
    /// Integers, every element equal.
    Exact,
    /// Kept for diagnosis; never fails a case.
    Info,
}

impl CompareKind {
    fn as_str(self) -> &'static str {
        match self {
            CompareKind::Allclose => "allclose",
            CompareKind::Exact => "exact",
            CompareKind::Info => "info",
        }
    }
}

/// Where the checkpoint is and how it is stored.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Checkpoint {
    /// Folder or file; relative paths are relative to the case folder.
    pub path: PathBuf,
    /// `safetensors` (config.json + *.safetensors) or `gguf`.
    pub format: String,
}

/// One tensor of inputs.safetensors or expected.safetensors as case.json describes it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TensorEntry {
    /// Key in the safetensors file.
    pub name: String,
    /// safetensors dtype name (`F32`, `BF16`, `F16`, `I64`, `I32`).
    pub dtype: String,
    /// Dimensions.
    pub shape: Vec<usize>,
    /// What the tensor is, for humans.
    pub meaning: String,
    /// Outputs only: how the output is judged.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compare: Option<CompareKind>,
    /// Outputs only: the input whose zeros mark positions to skip.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mask: Option<String>,
    /// Outputs only: overrides the case tolerance.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tolerance: Option<Tolerance>,
}

/// One eos id or several, as transformers' configs allow.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum TokenIds {
    /// A single id.
    One(i64),
    /// Several ids.
    Many(Vec<i64>),
}

impl TokenIds {
    /// The ids as a list.
    pub fn to_vec(&self) -> Vec<i64> {
        match self {
            TokenIds::One(id) => vec![*id],
            TokenIds::Many(ids) => ids.clone(),
        }
    }
}

/// The greedy generation settings that produced `generated_ids`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GenerationSpec {
    /// Always false for parity cases (greedy).
    pub do_sample: bool,
    /// Tokens generated per prompt at most.
    pub max_new_tokens: usize,
    /// Tokens before eos may be chosen (its logit is -inf until then).
    pub min_new_tokens: usize,
    /// The pad id used for left padding.
    #[serde(default)]
    pub pad_token_id: Option<i64>,
    /// The eos id(s).
    #[serde(default)]
    pub eos_token_id: Option<TokenIds>,
    /// Smallest best-minus-second-best gap over every greedy step of the reference.
    #[serde(default)]
    pub min_top2_margin: Option<f64>,
    /// The decoder's first input of an encoder-decoder (`text2text-generation`).
    #[serde(default)]
    pub decoder_start_token_id: Option<i64>,
}

/// Who made the numbers and how.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Reference {
    /// The generator script.
    pub generator: String,
    /// The exact command line, from the repository root.
    pub command: String,
    /// Library name -> version.
    pub library_versions: BTreeMap<String, String>,
    /// Any further provenance (threads, device, attention implementation).
    #[serde(flatten)]
    pub extra: BTreeMap<String, serde_json::Value>,
}

/// The parsed case.json.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CaseSpec {
    /// Schema version; [`FORMAT_VERSION`].
    pub format_version: u32,
    /// Case id.
    pub name: String,
    /// Class to instantiate, e.g. `LlamaForCausalLM`.
    pub architecture: String,
    /// config.json's `model_type`.
    pub model_type: String,
    /// What the model is asked to do.
    pub task: Task,
    /// Dtype of the weights and of the reference run.
    pub dtype: CaseDtype,
    /// Default tolerance for `allclose` outputs.
    pub tolerance: Tolerance,
    /// Seed of weights and inputs (informational).
    pub seed: u64,
    /// What the case exercises.
    pub description: String,
    /// Tags (`gqa`, `rope:yarn`, `left-padding`, ...).
    #[serde(default)]
    pub features: Vec<String>,
    /// Where the checkpoint is.
    pub checkpoint: Checkpoint,
    /// inputs.safetensors, described.
    pub inputs: Vec<TensorEntry>,
    /// expected.safetensors, described.
    pub outputs: Vec<TensorEntry>,
    /// Greedy settings for causal LMs.
    #[serde(default)]
    pub generation: Option<GenerationSpec>,
    /// Provenance.
    pub reference: Reference,
    /// Vision cases: run with the position embeddings interpolated to the image's patch
    /// grid (transformers' `interpolate_pos_encoding`).
    #[serde(default)]
    pub interpolate_pos_encoding: bool,
    /// PEFT LoRA adapters merged into the checkpoint as it loads, in order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub adapters: Vec<AdapterEntry>,
    /// Fields this version does not know (kept, ignored).
    #[serde(flatten)]
    pub extra: BTreeMap<String, serde_json::Value>,
}

/// One adapter of a case: its folder (relative to the case) and its weight.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AdapterEntry {
    /// The folder holding `adapter_config.json` and `adapter_model.safetensors`.
    pub path: PathBuf,
    /// The adapter's weight (PEFT's `set_scale`).
    #[serde(default = "one")]
    pub scale: f64,
}

fn one() -> f64 {
    1.0
}

/// `dir/case.json` parsed as `T`; a bad field is named by its JSON path.
pub(crate) fn read_case_json<T: serde::de::DeserializeOwned>(dir: &Path) -> Result<T, CaseError> {
    let path = dir.join(CASE_JSON);
    let text = std::fs::read_to_string(&path).map_err(|source| CaseError::Io {
        path: path.clone(),
        source,
    })?;
    let mut de = serde_json::Deserializer::from_str(&text);
    serde_path_to_error::deserialize(&mut de).map_err(|e| CaseError::Json {
        path,
        field: e.path().to_string(),
        source: e.into_inner(),
    })
}

impl CaseSpec {
    /// Reads and parses `dir/case.json` only (no tensors): cheap, for listing cases.
    pub fn read(dir: &Path) -> Result<Self, CaseError> {
        let path = dir.join(CASE_JSON);
        let spec: CaseSpec = read_case_json(dir)?;
        if spec.format_version != FORMAT_VERSION {
            return Err(CaseError::UnsupportedFormatVersion {
                path,
                found: spec.format_version,
                supported: FORMAT_VERSION,
            });
        }
        Ok(spec)
    }
}

/// A loaded and validated case.
#[derive(Debug, Clone)]
pub struct Case {
    /// The case folder.
    pub dir: PathBuf,
    /// case.json.
    pub spec: CaseSpec,
    /// inputs.safetensors, by name.
    pub inputs: TensorSet,
    /// expected.safetensors, by name.
    pub expected: TensorSet,
}

/// How a port's output compared with one reference output.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OutputReport {
    /// Output name.
    pub name: String,
    /// How it was judged.
    pub compare: CompareKind,
    /// False only for a failing `allclose` or `exact` output.
    pub passed: bool,
    /// Float metrics (`allclose`, and float `info` outputs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub close: Option<CloseMetrics>,
    /// Integer metrics (`exact`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokens: Option<TokenMetrics>,
}

impl Case {
    /// Loads `dir`: parses case.json, reads both safetensors files and checks that they
    /// agree with case.json.
    pub fn load(dir: &Path) -> Result<Self, CaseError> {
        let spec = CaseSpec::read(dir)?;
        let json = dir.join(CASE_JSON);
        let inputs_path = dir.join(INPUTS_FILE);
        let expected_path = dir.join(EXPECTED_FILE);
        let inputs = read_safetensors(&inputs_path)?;
        let expected = read_safetensors(&expected_path)?;
        check_listing(&json, "inputs", &spec.inputs, &inputs, &inputs_path)?;
        check_listing(&json, "outputs", &spec.outputs, &expected, &expected_path)?;
        check_outputs(&json, &spec, &inputs)?;
        Ok(Self {
            dir: dir.to_path_buf(),
            spec,
            inputs,
            expected,
        })
    }

    /// Name of the case.
    pub fn name(&self) -> &str {
        &self.spec.name
    }

    /// The checkpoint folder or file, resolved against the case folder.
    pub fn checkpoint_path(&self) -> PathBuf {
        if self.spec.checkpoint.path.is_absolute() {
            self.spec.checkpoint.path.clone()
        } else {
            self.dir.join(&self.spec.checkpoint.path)
        }
    }

    /// The case's adapters as zoo loads them, paths resolved against the case folder.
    pub fn adapters(&self) -> Vec<zoo_transformers::Adapter> {
        self.spec
            .adapters
            .iter()
            .map(|a| {
                zoo_transformers::Adapter::new(self.dir.join(&a.path).to_string_lossy())
                    .with_scale(a.scale)
            })
            .collect()
    }

    /// The case.json entry of an output.
    pub fn output_entry(&self, name: &str) -> Option<&TensorEntry> {
        self.spec.outputs.iter().find(|e| e.name == name)
    }

    /// Tolerance for an output: its own override, else the case's.
    pub fn tolerance_for(&self, entry: &TensorEntry) -> Tolerance {
        entry.tolerance.unwrap_or(self.spec.tolerance)
    }

    /// Compares a port's tensor with the reference output `name`, applying the entry's
    /// compare kind, mask and tolerance. Top-1 agreement is reported for outputs whose
    /// name ends in `logits`.
    pub fn compare_output(
        &self,
        name: &str,
        actual: &HostTensor,
    ) -> Result<OutputReport, CompareError> {
        let entry = self
            .output_entry(name)
            .ok_or_else(|| CompareError::UnknownOutput {
                case: self.spec.name.clone(),
                name: name.to_string(),
                available: self
                    .spec
                    .outputs
                    .iter()
                    .map(|e| e.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", "),
            })?;
        // Load validated that every entry has its tensor.
        let expected = &self.expected[name];
        let kind = entry.compare.unwrap_or(CompareKind::Allclose);
        let metrics_err = |source| CompareError::Metrics {
            case: self.spec.name.clone(),
            name: name.to_string(),
            source,
        };
        if actual.shape != expected.shape {
            return Err(metrics_err(MetricsError::ShapeMismatch {
                expected: expected.shape.clone(),
                actual: actual.shape.clone(),
            }));
        }
        let mask = entry.mask.as_ref().map(|m| {
            let t = &self.inputs[m];
            PositionMask::from_i64(t.shape.clone(), t.as_i64().unwrap_or_default())
        });
        match (expected.as_f32(), expected.as_i64()) {
            (Some(exp), _) => {
                let act = actual
                    .as_f32()
                    .ok_or_else(|| self.kind_error(name, "float", "integer"))?;
                let mut close = compare_close(
                    act,
                    exp,
                    &expected.shape,
                    mask.as_ref(),
                    self.tolerance_for(entry),
                )
                .map_err(metrics_err)?;
                // Argmax over the last dimension where the mask leaves it whole (a span's
                // start and end logits are masked per position: no argmax of theirs is kept).
                let whole_rows = mask
                    .as_ref()
                    .is_none_or(|m| m.shape.len() < expected.shape.len());
                if name.ends_with("logits") && whole_rows {
                    close.top1_agreement = top1_agreement(act, exp, &expected.shape, mask.as_ref())
                        .map_err(metrics_err)?;
                }
                Ok(OutputReport {
                    name: name.to_string(),
                    compare: kind,
                    passed: kind == CompareKind::Info || close.passed,
                    close: Some(close),
                    tokens: None,
                })
            }
            (_, Some(exp)) => {
                let act = actual
                    .as_i64()
                    .ok_or_else(|| self.kind_error(name, "integer", "float"))?;
                let tokens = compare_tokens(act, exp, &expected.shape).map_err(metrics_err)?;
                Ok(OutputReport {
                    name: name.to_string(),
                    compare: kind,
                    passed: kind == CompareKind::Info || tokens.passed,
                    close: None,
                    tokens: Some(tokens),
                })
            }
            (None, None) => unreachable!("a HostTensor holds floats or integers"),
        }
    }

    fn kind_error(&self, name: &str, expected: &'static str, found: &'static str) -> CompareError {
        CompareError::ElementKind {
            case: self.spec.name.clone(),
            name: name.to_string(),
            expected,
            found,
        }
    }
}

/// Every listed tensor exists with the declared shape and dtype; nothing is unlisted.
fn check_listing(
    json: &Path,
    list: &str,
    entries: &[TensorEntry],
    tensors: &TensorSet,
    file: &Path,
) -> Result<(), CaseError> {
    for (i, entry) in entries.iter().enumerate() {
        let field = format!("{list}[{i}]");
        let tensor = tensors
            .get(&entry.name)
            .ok_or_else(|| CaseError::MissingTensor {
                path: json.to_path_buf(),
                field: field.clone(),
                name: entry.name.clone(),
                file: file.to_path_buf(),
            })?;
        if tensor.shape != entry.shape {
            return Err(CaseError::Mismatch {
                path: json.to_path_buf(),
                field: format!("{field}.shape"),
                what: "shape",
                declared: format!("{:?}", entry.shape),
                found: format!("{:?}", tensor.shape),
            });
        }
        if tensor.stored_dtype != entry.dtype {
            return Err(CaseError::Mismatch {
                path: json.to_path_buf(),
                field: format!("{field}.dtype"),
                what: "dtype",
                declared: entry.dtype.clone(),
                found: tensor.stored_dtype.clone(),
            });
        }
    }
    if let Some(name) = tensors
        .keys()
        .find(|n| !entries.iter().any(|e| &e.name == *n))
    {
        return Err(CaseError::UnlistedTensor {
            path: json.to_path_buf(),
            file: file.to_path_buf(),
            name: name.clone(),
        });
    }
    Ok(())
}

/// Something is compared; compare kinds fit the dtypes; masks name integer inputs whose
/// shape prefixes the output and keep at least one element.
fn check_outputs(json: &Path, spec: &CaseSpec, inputs: &TensorSet) -> Result<(), CaseError> {
    if !spec
        .outputs
        .iter()
        .any(|e| e.compare != Some(CompareKind::Info))
    {
        return Err(CaseError::NothingToCompare {
            path: json.to_path_buf(),
        });
    }
    for (i, entry) in spec.outputs.iter().enumerate() {
        let is_int = entry.dtype.starts_with('I') || entry.dtype.starts_with('U');
        let kind = entry.compare.unwrap_or(CompareKind::Allclose);
        let fits = match kind {
            CompareKind::Allclose => !is_int,
            CompareKind::Exact => is_int,
            CompareKind::Info => true,
        };
        if !fits {
            return Err(CaseError::CompareKind {
                path: json.to_path_buf(),
                field: format!("outputs[{i}].compare"),
                compare: kind.as_str().to_string(),
                dtype: entry.dtype.clone(),
            });
        }
        let Some(mask) = &entry.mask else { continue };
        let field = format!("outputs[{i}].mask");
        let bad = |problem: String| CaseError::BadMask {
            path: json.to_path_buf(),
            field: field.clone(),
            problem,
        };
        let tensor = inputs
            .get(mask)
            .ok_or_else(|| bad(format!("`{mask}` is not an input of this case")))?;
        let Some(values) = tensor.as_i64() else {
            return Err(bad(format!("input `{mask}` must hold integers (0 = skip)")));
        };
        if values.iter().all(|&v| v == 0) {
            return Err(bad(format!(
                "input `{mask}` is all zeros: the comparison would skip every element"
            )));
        }
        let prefix = tensor.shape.len() <= entry.shape.len()
            && entry.shape[..tensor.shape.len()] == tensor.shape[..];
        if !prefix {
            return Err(bad(format!(
                "input `{mask}` has shape {:?}, not a prefix of output shape {:?}",
                tensor.shape, entry.shape
            )));
        }
    }
    Ok(())
}

/// Case folders under `root`, sorted by path: `root` itself if it holds case.json,
/// else each immediate sub-folder that does. Hidden folders (a generator's
/// `.name.partial` work folders) are skipped.
pub fn discover(root: &Path) -> Result<Vec<PathBuf>, CaseError> {
    if root.join(CASE_JSON).is_file() {
        return Ok(vec![root.to_path_buf()]);
    }
    let io = |source| CaseError::Io {
        path: root.to_path_buf(),
        source,
    };
    let mut found = Vec::new();
    for entry in std::fs::read_dir(root).map_err(io)? {
        let path = entry.map_err(io)?.path();
        let hidden = path
            .file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.starts_with('.'));
        if !hidden && path.join(CASE_JSON).is_file() {
            found.push(path);
        }
    }
    found.sort();
    Ok(found)
}
