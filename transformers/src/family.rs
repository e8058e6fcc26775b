//! What a family is, as the registry lists it: how transformers names it (`model_type`,
//! architecture classes and the task each serves, GGUF names), how it splits over devices
//! ([`Layout`]) and how zoo loads it ([`Loaders`]). A leaf: model files import it to declare
//! their entry, and `registry` lists the entries.

use zoo_hub::{Dtype, Inventory, PretrainedConfig};
use zoo_runtime::device_map::{units_from_inventory, ModelShape, TpPlan, Unit, UnitRules};
use zoo_runtime::nn::Weights;

use crate::kinds::{CausalLm, DecoderModel, Encoder, ImageEncoder, ImageTextModel, Seq2SeqLm};
use crate::{Error, Result};

/// What an architecture class computes, as transformers' `AutoModelFor*` classes group them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Task {
    /// The base model: hidden states (`AutoModel`).
    Base,
    /// Next-token logits (`AutoModelForCausalLM`).
    CausalLm,
    /// Masked-token logits (`AutoModelForMaskedLM`).
    MaskedLm,
    /// One label per sequence (`AutoModelForSequenceClassification`).
    SequenceClassification,
    /// One label per token (`AutoModelForTokenClassification`).
    TokenClassification,
    /// An answer span's start and end scores per token (`AutoModelForQuestionAnswering`).
    QuestionAnswering,
    /// One score per choice of a `[batch, choices, seq]` input
    /// (`AutoModelForMultipleChoice`).
    MultipleChoice,
    /// One label per image (`AutoModelForImageClassification`).
    ImageClassification,
    /// Encoder-decoder generation (`AutoModelForSeq2SeqLM`).
    Seq2SeqLm,
    /// Text generation from text and images (`AutoModelForImageTextToText`).
    ImageTextToText,
}

impl Task {
    /// The `AutoModelFor*` class of the task.
    pub fn auto_class(self) -> &'static str {
        match self {
            Task::Base => "AutoModel",
            Task::CausalLm => "AutoModelForCausalLM",
            Task::MaskedLm => "AutoModelForMaskedLM",
            Task::SequenceClassification => "AutoModelForSequenceClassification",
            Task::TokenClassification => "AutoModelForTokenClassification",
            Task::QuestionAnswering => "AutoModelForQuestionAnswering",
            Task::MultipleChoice => "AutoModelForMultipleChoice",
            Task::ImageClassification => "AutoModelForImageClassification",
            Task::Seq2SeqLm => "AutoModelForSeq2SeqLM",
            Task::ImageTextToText => "AutoModelForImageTextToText",
        }
    }

    /// Refuses any task but [`Task::Base`] for a family that has no heads; `what` says what
    /// the family computes instead.
    pub(crate) fn base_only(self, config: &PretrainedConfig, what: &str) -> Result<()> {
        if self == Task::Base {
            return Ok(());
        }
        Err(Error::Config {
            path: config.path.clone(),
            reason: format!("{what}; zoo has no {} head for it", self.auto_class()),
        })
    }
}

/// One architecture class of a family (`config.json`'s `architectures` entry).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Architecture {
    /// The class name, e.g. `LlamaForCausalLM`.
    pub name: &'static str,
    /// What it computes.
    pub task: Task,
}

/// How transformers names a family built on another's decoder (`llama::family`,
/// `gemma::family` make its [`Family`] from these and its switches).
pub struct Names {
    /// `config.json`'s `model_type`.
    pub model_type: &'static str,
    /// The transformers file the family mirrors.
    pub modeling_file: &'static str,
    /// Its architecture classes.
    pub architectures: &'static [Architecture],
    /// GGUF `general.architecture` values read as this family.
    pub gguf_architectures: &'static [&'static str],
    /// HF's `_no_split_modules`.
    pub no_split_modules: &'static [&'static str],
    /// The tensor-parallel plan ([`Family::tp_plan`]).
    pub tp_plan: TpPlan,
}

impl Names {
    /// The registry entry these names make with the family's hooks.
    pub const fn family(
        self,
        validate: fn(&PretrainedConfig) -> Result<()>,
        layout: fn(&PretrainedConfig) -> Result<Layout>,
        loaders: Loaders,
    ) -> Family {
        Family {
            model_type: self.model_type,
            modeling_file: self.modeling_file,
            architectures: self.architectures,
            gguf_architectures: self.gguf_architectures,
            no_split_modules: self.no_split_modules,
            tp_plan: self.tp_plan,
            conv1d_modules: &[],
            validate,
            layout,
            loaders,
        }
    }
}

impl Architecture {
    /// The class `name` serving `task`.
    pub const fn new(name: &'static str, task: Task) -> Architecture {
        Architecture { name, task }
    }
}

/// How a family's checkpoints are built: a decoder with a cache, or a bidirectional encoder.
#[derive(Clone, Copy, Debug)]
pub enum Loaders {
    /// Decoder families: the base model and the causal LM.
    Decoder {
        /// The base decoder from the weights under its prefix.
        base: fn(&Weights, &PretrainedConfig) -> Result<Box<dyn DecoderModel>>,
        /// The causal LM from the checkpoint root.
        causal_lm: fn(&Weights, &PretrainedConfig) -> Result<Box<dyn CausalLm>>,
    },
    /// Encoder families: one loader for every head (the task picks it), from the
    /// checkpoint root.
    Encoder(fn(&Weights, &PretrainedConfig, Task) -> Result<Box<dyn Encoder>>),
    /// Vision encoders (pixel values in): one loader for every head, from the checkpoint
    /// root.
    Image(fn(&Weights, &PretrainedConfig, Task) -> Result<Box<dyn ImageEncoder>>),
    /// Contrastive image-text models (`CLIPModel`), from the checkpoint root.
    ImageText(fn(&Weights, &PretrainedConfig) -> Result<Box<dyn ImageTextModel>>),
    /// Encoder-decoder families (T5): the encoder alone (`T5EncoderModel`, what diffusion
    /// pipelines read) and the whole model with its language-model head, from the checkpoint
    /// root.
    Seq2Seq {
        /// The encoder stack, for the `Base` task.
        encoder: fn(&Weights, &PretrainedConfig, Task) -> Result<Box<dyn Encoder>>,
        /// Encoder, decoder and head (`T5ForConditionalGeneration`).
        seq2seq: fn(&Weights, &PretrainedConfig) -> Result<Box<dyn Seq2SeqLm>>,
    },
}

/// A family's registry entry from how transformers names it: `model_type`, the folder of its
/// `modeling_*.py`, its classes with the task each serves, HF's `_no_split_modules`, the
/// typed config that validates a checkpoint's `config.json` (`Config::from_pretrained`), and
/// its loaders; the planner's view is the file's `layout`. No GGUF architecture maps to it
/// (the decoders llama.cpp writes are declared with [`Names`]).
macro_rules! family {
    (
        $model_type:literal in $folder:literal,
        classes [$($class:ident: $task:ident),+ $(,)?],
        no_split [$($no_split:literal),+ $(,)?],
        tp $tp:expr,
        config $config:ty, loaders $loaders:expr $(,)?
    ) => {
        $crate::family::Family {
            model_type: $model_type,
            modeling_file: concat!("models/", $folder, "/modeling_", $folder, ".py"),
            architectures: &[$($crate::family::Architecture::new(
                stringify!($class),
                $crate::family::Task::$task,
            )),+],
            gguf_architectures: &[],
            no_split_modules: &[$($no_split),+],
            tp_plan: $tp,
            conv1d_modules: &[],
            validate: |c| <$config>::from_pretrained(c).map(drop),
            layout,
            loaders: $loaders,
        }
    };
}
pub(crate) use family;

/// Declares a family that reuses another family's decoder with its own switches, as
/// transformers' `modular_*.py` files derive one: the registry entry `FAMILY` (the class names
/// are the aliases' names and the classification `heads` transformers gives the family,
/// `_no_split_modules` is `{Switches}DecoderLayer`, the modeling file sits in `folder`), the
/// switches type reading them with the file's `features`, and the two class aliases. The family file then holds only its docs and `features`.
macro_rules! derived_decoder {
    (
        $base:ident::{$base_model:ident, $base_lm:ident}
            as $switches:ident { $model:ident, $lm:ident },
        model_type $model_type:literal, folder $folder:literal, gguf [$($gguf:literal),*],
        heads [$($head:ident: $head_task:ident),* $(,)?] $(,)?
    ) => {
        #[doc = concat!("The registry entry of `", $model_type, "`: the ", stringify!($base_model),
            " decoder with ", stringify!($switches), "'s switches.")]
        pub(crate) const FAMILY: $crate::family::Family =
            $base::family::<$switches>($crate::family::Names {
                model_type: $model_type,
                modeling_file: concat!("models/", $folder, "/modeling_", $folder, ".py"),
                architectures: &[
                    $crate::family::Architecture::new(
                        stringify!($lm),
                        $crate::family::Task::CausalLm,
                    ),
                    $crate::family::Architecture::new(
                        stringify!($model),
                        $crate::family::Task::Base,
                    ),
                    $($crate::family::Architecture::new(
                        stringify!($head),
                        $crate::family::Task::$head_task,
                    ),)*
                ],
                gguf_architectures: &[$($gguf),*],
                no_split_modules: &[concat!(stringify!($switches), "DecoderLayer")],
                tp_plan: $base::TP_PLAN,
            });

        #[doc = concat!(stringify!($switches), "'s switches ([`features`]).")]
        pub(crate) struct $switches;
        impl $base::Switches for $switches {
            const FEATURES: $base::FeaturesFn = features;
        }

        #[doc = concat!("`", stringify!($model), "`: `", stringify!($base_model), "` with ",
            stringify!($switches), "'s switches.")]
        pub type $model = $base::$base_model;
        #[doc = concat!("`", stringify!($lm), "`: `", stringify!($base_lm), "` with ",
            stringify!($switches), "'s switches.")]
        pub type $lm = $base::$base_lm;
    };
}
pub(crate) use derived_decoder;

/// How a checkpoint of the family splits over devices, from its config: the device-map
/// planner's view of the model (it names no module path itself).
#[derive(Clone, Debug, PartialEq)]
pub struct Layout {
    /// Containers whose numbered children are no-split units (`model.layers`), HF's
    /// `_no_split_modules` as module paths.
    pub layer_containers: Vec<String>,
    /// Modules that run before the layers (the embeddings).
    pub inputs: Vec<String>,
    /// Tensors that share storage (HF's `_tied_weights_keys`), each group placed together.
    pub tied: Vec<Vec<String>>,
    /// What each layer costs beyond its weights: KV cache (decoders) and activations.
    pub shape: ModelShape,
    /// The longest sequence the model takes (`max_position_embeddings`): what an encoder's
    /// plan is sized for by default, and a decoder's load at most.
    pub context: usize,
}

impl Layout {
    /// The checkpoint's no-split units in execution order, weights counted in `dtype` (as
    /// stored when `None`); a tied group counts only where all its tensors are stored.
    pub fn units(&self, inventory: &Inventory, dtype: Option<Dtype>) -> Vec<Unit> {
        let containers: Vec<&str> = self.layer_containers.iter().map(String::as_str).collect();
        let inputs: Vec<&str> = self.inputs.iter().map(String::as_str).collect();
        let tied: Vec<Vec<String>> = self
            .tied
            .iter()
            .filter(|g| g.iter().all(|t| inventory.get(t).is_some()))
            .cloned()
            .collect();
        let rules = UnitRules {
            layer_containers: &containers,
            inputs: &inputs,
            tied: &tied,
        };
        units_from_inventory(inventory, &rules, dtype)
    }
}

/// One family: how transformers names it and how zoo loads it.
#[derive(Debug)]
pub struct Family {
    /// `config.json`'s `model_type`.
    pub model_type: &'static str,
    /// The transformers file the model file mirrors.
    pub modeling_file: &'static str,
    /// Every architecture class, the family's default for its kind first.
    pub architectures: &'static [Architecture],
    /// llama.cpp's `general.architecture` names whose GGUF files load as this family.
    pub gguf_architectures: &'static [&'static str],
    /// HF's `_no_split_modules`: the classes a device map never cuts through.
    pub no_split_modules: &'static [&'static str],
    /// How its weights split over a mesh's `model` axis under tensor parallelism, as
    /// transformers' `base_model_tp_plan` (and `_tp_plan` for heads) says: module name
    /// patterns and styles, matched against full weight names. Modules it does not name
    /// are whole on every device of the mesh.
    pub tp_plan: TpPlan,
    /// Modules whose weights are stored `[in, out]` (transformers' `Conv1D`), by the last
    /// part of their names: how an adapter's update lies over a square weight.
    pub conv1d_modules: &'static [&'static str],
    /// Checks the config for impossible values before any weight is read.
    pub validate: fn(&PretrainedConfig) -> Result<()>,
    /// The planner's view of a checkpoint.
    pub layout: fn(&PretrainedConfig) -> Result<Layout>,
    /// How to build its models.
    pub loaders: Loaders,
}

impl Family {
    /// The architecture class `name`, if the family has it.
    pub fn architecture(&self, name: &str) -> Option<&'static Architecture> {
        self.architectures.iter().find(|a| a.name == name)
    }

    /// The family's class for `task`, if any.
    pub fn architecture_for(&self, task: Task) -> Option<&'static Architecture> {
        self.architectures.iter().find(|a| a.task == task)
    }

    /// Whether the family's models are decoders (generate text) rather than encoders.
    pub fn is_decoder(&self) -> bool {
        matches!(self.loaders, Loaders::Decoder { .. })
    }

    /// Whether the family generates text: a decoder, or an encoder-decoder.
    pub fn generates(&self) -> bool {
        matches!(
            self.loaders,
            Loaders::Decoder { .. } | Loaders::Seq2Seq { .. }
        )
    }
}
