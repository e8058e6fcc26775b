//! [`Pretrained`]: one model's files as `from_pretrained` sees them — config, generation
//! config, tokenizer files and weights — from a folder, a file, or a Hub repo id.

use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use serde_json::Value;

use crate::checkpoint::{find_checkpoint, Checkpoint, ModelIndex};
use crate::config::{read_json, GenerationConfig, PretrainedConfig, TokenizerConfig};
use crate::error::{io_err, Result};
use crate::gguf::GgufCheckpoint;
use crate::source::{ModelFiles, Source};

/// A model to load, resolved to where its files are.
#[derive(Clone, Debug)]
pub struct Pretrained {
    files: ModelFiles,
    /// A diffusers component folder (`unet`, `vae`, `text_encoder`), or none for the root.
    subfolder: Option<String>,
    /// A weights variant such as `fp16`.
    variant: Option<String>,
    /// The parsed GGUF file, read once and shared by clones (config, tokenizer and weights
    /// all come from it).
    gguf: Arc<OnceLock<GgufCheckpoint>>,
    /// The checkpoint found by the first [`Pretrained::checkpoint`], shared by clones of the
    /// same folder and variant: checking a config against its weights and loading them
    /// read the shard headers once.
    checkpoint: Arc<OnceLock<Checkpoint>>,
}

impl Pretrained {
    /// Resolves `input` (folder, file, or `org/name[@revision]`) with the default Hub cache and
    /// download policy.
    pub fn open(input: &str) -> Result<Pretrained> {
        Ok(Pretrained::from_files(ModelFiles::new(Source::parse(
            input,
        )?)))
    }

    /// Wraps already-resolved files.
    pub fn from_files(files: ModelFiles) -> Pretrained {
        Pretrained {
            files,
            subfolder: None,
            variant: None,
            gguf: Arc::default(),
            checkpoint: Arc::default(),
        }
    }

    /// The same model, reading the weights variant `variant` (`"fp16"`).
    pub fn with_variant(mut self, variant: Option<&str>) -> Result<Pretrained> {
        if let Some(v) = variant {
            crate::source::check_name("variant", v)?;
        }
        self.variant = variant.map(str::to_string);
        self.checkpoint = Arc::default();
        Ok(self)
    }

    /// A component of a diffusers pipeline (its subfolder, e.g. `"unet"`); a name that is
    /// not one folder name is refused.
    pub fn component(&self, name: &str) -> Result<Pretrained> {
        crate::source::check_name("component", name)?;
        let sub = match &self.subfolder {
            Some(s) => format!("{s}/{name}"),
            None => name.to_string(),
        };
        Ok(Pretrained {
            files: self.files.clone(),
            subfolder: Some(sub),
            variant: self.variant.clone(),
            gguf: Arc::default(),
            checkpoint: Arc::default(),
        })
    }

    /// Where the files come from.
    pub fn files(&self) -> &ModelFiles {
        &self.files
    }

    fn rel(&self, file: &str) -> String {
        match &self.subfolder {
            Some(s) => format!("{s}/{file}"),
            None => file.to_string(),
        }
    }

    /// The GGUF file behind this model, when the source is one.
    fn gguf_path(&self) -> Option<&Path> {
        match self.files.source() {
            Source::File(p) if p.extension().is_some_and(|e| e == "gguf") => Some(p),
            _ => None,
        }
    }

    /// The parsed GGUF checkpoint, when the source is a `.gguf` file; parsed on first use.
    pub fn gguf(&self) -> Result<Option<&GgufCheckpoint>> {
        let Some(path) = self.gguf_path() else {
            return Ok(None);
        };
        if let Some(ck) = self.gguf.get() {
            return Ok(Some(ck));
        }
        let ck = crate::gguf::open(path)?;
        Ok(Some(self.gguf.get_or_init(|| ck)))
    }

    /// `config.json` (for a GGUF file, the config its metadata describes).
    pub fn config(&self) -> Result<PretrainedConfig> {
        if let (Some(ck), Some(path)) = (self.gguf()?, self.gguf_path()) {
            return PretrainedConfig::from_value(ck.config.clone(), path);
        }
        let path = self.files.get(&self.rel("config.json"))?;
        PretrainedConfig::from_file(&path)
    }

    /// `generation_config.json`, when the model has one.
    pub fn generation_config(&self) -> Result<Option<GenerationConfig>> {
        match self
            .files
            .get_optional(&self.rel("generation_config.json"))?
        {
            Some(p) => Ok(Some(GenerationConfig::from_file(&p)?)),
            None => Ok(None),
        }
    }

    /// `tokenizer_config.json`, with the chat template of a separate `chat_template.jinja`
    /// (where newer checkpoints keep it) filled in when the JSON has none.
    pub fn tokenizer_config(&self) -> Result<Option<TokenizerConfig>> {
        if let (Some(ck), Some(path)) = (self.gguf()?, self.gguf_path()) {
            return match &ck.tokenizer_config {
                Some(v) => Ok(Some(crate::config::parse_json(
                    path,
                    &serde_json::to_vec(v).unwrap_or_default(),
                )?)),
                None => Ok(None),
            };
        }
        let Some(path) = self
            .files
            .get_optional(&self.rel("tokenizer_config.json"))?
        else {
            return Ok(None);
        };
        let mut config = TokenizerConfig::from_file(&path)?;
        if config.chat_template.is_none() {
            if let Some(jinja) = self.files.get_optional(&self.rel("chat_template.jinja"))? {
                let text = std::fs::read_to_string(&jinja).map_err(io_err(&jinja))?;
                config.chat_template = Some(crate::config::ChatTemplate::One(text));
            }
        }
        Ok(Some(config))
    }

    /// `tokenizer.json` as JSON: for a GGUF file, the tokenizer its vocabulary describes;
    /// without one, what transformers builds from a CLIP tokenizer's `vocab.json` and
    /// `merges.txt` (see [`crate::slow_tokenizer`]).
    pub fn tokenizer_json(&self) -> Result<Option<Value>> {
        if let Some(ck) = self.gguf()? {
            return ck.tokenizer_json();
        }
        if let Some(p) = self.files.get_optional(&self.rel("tokenizer.json"))? {
            return Ok(Some(read_json(&p)?));
        }
        let config = self.tokenizer_config()?.unwrap_or_default();
        let class = config.tokenizer_class.as_deref().unwrap_or_default();
        if !crate::slow_tokenizer::CLASSES.contains(&class) {
            return Ok(None);
        }
        let vocab = self.files.get_optional(&self.rel("vocab.json"))?;
        let merges = self.files.get_optional(&self.rel("merges.txt"))?;
        match (vocab, merges) {
            (Some(v), Some(m)) => Ok(Some(crate::slow_tokenizer::clip(&v, &m, &config)?)),
            _ => Ok(None),
        }
    }

    /// The path of `tokenizer.json`, when it is a file.
    pub fn tokenizer_path(&self) -> Result<Option<PathBuf>> {
        self.files.get_optional(&self.rel("tokenizer.json"))
    }

    /// The path of `config.json` in this model's folder (a pipeline component's own), when
    /// it has one.
    pub fn config_path(&self) -> Result<Option<PathBuf>> {
        self.files.get_optional(&self.rel("config.json"))
    }

    /// `preprocessor_config.json` (an image processor's settings), when the model has one.
    pub fn preprocessor_config_path(&self) -> Result<Option<PathBuf>> {
        self.files
            .get_optional(&self.rel("preprocessor_config.json"))
    }

    /// `processor_config.json` (a processor's settings; since transformers 5 it holds the
    /// image processor's under `"image_processor"`), when the model has one.
    pub fn processor_config_path(&self) -> Result<Option<PathBuf>> {
        self.files.get_optional(&self.rel("processor_config.json"))
    }

    /// `model_index.json` of a diffusers pipeline, when this is one.
    pub fn model_index(&self) -> Result<Option<ModelIndex>> {
        match self.files.get_optional(&self.rel("model_index.json"))? {
            Some(p) => Ok(Some(ModelIndex::from_file(&p)?)),
            None => Ok(None),
        }
    }

    /// The weights and their inventory (headers only; no tensor data is read; found once,
    /// then cloned).
    pub fn checkpoint(&self) -> Result<Checkpoint> {
        if let Some(ck) = self.checkpoint.get() {
            return Ok(ck.clone());
        }
        let ck = if let (Some(ck), Some(path)) = (self.gguf()?, self.gguf_path()) {
            Checkpoint {
                format: crate::checkpoint::Format::Gguf,
                index: None,
                files: vec![path.to_path_buf()],
                inventory: ck.inventory.clone(),
            }
        } else {
            find_checkpoint(
                &self.files,
                self.subfolder.as_deref(),
                self.variant.as_deref(),
            )?
        };
        Ok(self.checkpoint.get_or_init(|| ck).clone())
    }
}
