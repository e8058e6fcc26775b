//! Classify a text with a sequence-classification checkpoint (labels from its `id2label`),
//! printing each label's probability: a BERT classifier, or a decoder with transformers'
//! classification head (`LlamaForSequenceClassification`, `Qwen2ForSequenceClassification`,
//! ..., as reward models are published), which scores the last token.
//!
//! cargo run -p zoo-examples --example classify -- path/to/bert-sst2 "A wonderful film."

use zoo_hub::Pretrained;
use zoo_runtime::device_map::DeviceMap;
use zoo_runtime::{DType, Tensor};
use zoo_transformers::{AutoModelForSequenceClassification, EncoderArgs, EncoderHead, Tokenizer};

fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let (Some(model), Some(text)) = (args.next(), args.next()) else {
        anyhow::bail!("usage: classify <model> <text>");
    };
    let classifier = AutoModelForSequenceClassification::load_pretrained(&model, DeviceMap::Cpu)?;
    let tokenizer = Tokenizer::from_pretrained(&Pretrained::open(&model)?)?;
    let ids: Vec<i64> = tokenizer
        .encode_truncated(&text, classifier.max_position_embeddings())?
        .into_iter()
        .map(i64::from)
        .collect();
    let n = ids.len();
    let input_ids = Tensor::from_vec(ids, &[1, n], &classifier.device())?;
    let out = classifier.forward(EncoderArgs {
        input_ids: &input_ids,
        attention_mask: None,
        token_type_ids: None,
        position_ids: None,
        output_hidden_states: false,
    })?;
    let logits = out
        .logits
        .ok_or_else(|| anyhow::anyhow!("the head returned no logits"))?;
    let probs = logits.to_dtype(DType::F32)?.softmax(-1)?.to_vec::<f32>()?;
    if let EncoderHead::SequenceClassification { labels } = classifier.head() {
        for (label, p) in labels.iter().zip(probs) {
            println!("{label:>12}  {p:.4}");
        }
    }
    Ok(())
}
