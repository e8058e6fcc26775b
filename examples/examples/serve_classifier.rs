//! Serve a text classifier (sentiment, topics, NLI: any `*ForSequenceClassification` of
//! several labels) from your own program: text-embeddings-inference's `/predict` and vLLM's
//! `/classify` answer with the scores of transformers' `text-classification` pipeline.
//!
//! cargo run --release -p zoo-examples --example serve_classifier -- MODEL [PORT]
//! curl http://127.0.0.1:8080/predict -H 'Content-Type: application/json' \
//!     -d '{"inputs": ["I loved it.", "It was dull."]}'
//! curl http://127.0.0.1:8080/classify -H 'Content-Type: application/json' \
//!     -d '{"model": "local", "input": ["I loved it."]}'
//!
//! MODEL is a folder (config.json + safetensors + tokenizer.json) or a Hub repo id.

use anyhow::{Context, Result};
use zoo_serve::{ServeOptions, Server};
use zoo_transformers::text_classification::TextClassifier;

fn main() -> Result<()> {
    let mut args = std::env::args().skip(1);
    let model_path = args
        .next()
        .context("usage: serve_classifier MODEL [PORT]")?;
    let port: u16 = args
        .next()
        .map_or(Ok(8080), |p| p.parse())
        .context("PORT")?;
    let classifier = TextClassifier::load_pretrained(&model_path, Default::default())?;
    println!("labels: {}", classifier.labels().join(", "));
    let server = Server::start(classifier, ServeOptions::new("local"))?;
    tokio::runtime::Runtime::new()?.block_on(async move {
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", port)).await?;
        println!("{} on http://{}", server.serves(), listener.local_addr()?);
        let stop = async {
            let _ = tokio::signal::ctrl_c().await;
        };
        server.serve(listener, stop).await?;
        Ok(())
    })
}
