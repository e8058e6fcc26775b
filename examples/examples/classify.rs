//! Classify texts with a sequence-classification checkpoint as transformers'
//! `text-classification` pipeline does, printing every label's score best first: a BERT,
//! RoBERTa, DistilBERT or ModernBERT classifier, or a decoder with transformers'
//! classification head (`LlamaForSequenceClassification`, ..., as reward models are
//! published), which scores the last token. Several labels get a softmax; one label or a
//! multi-label `problem_type` a sigmoid.
//!
//! cargo run -p zoo-examples --example classify -- path/to/bert-sst2 "A wonderful film." "Dull."

use zoo_transformers::text_classification::TextClassifier;
use zoo_transformers::LoadOptions;

fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let Some(model) = args.next() else {
        anyhow::bail!("usage: classify <model> <text> [<text>...]");
    };
    let texts: Vec<String> = args.collect();
    if texts.is_empty() {
        anyhow::bail!("usage: classify <model> <text> [<text>...]");
    }
    let classifier = TextClassifier::load_pretrained(&model, LoadOptions::default())?;
    let texts: Vec<&str> = texts.iter().map(String::as_str).collect();
    // `true`: cut a text longer than the model takes instead of refusing it.
    for (text, labels) in texts.iter().zip(classifier.classify(&texts, true)?) {
        println!("{text}");
        for s in labels {
            println!(
                "  {:>12}  {:.4} ({})",
                s.label,
                s.score,
                classifier.function().name()
            );
        }
    }
    Ok(())
}
