//! Serve a model over OpenAI's API from your own program: the server is a library, so an
//! application can start it on its own tokio runtime, pick the address and decide when it
//! stops (here: at Ctrl-C, finishing the requests that run).
//!
//! cargo run --release -p zoo-examples --example serve -- MODEL [PORT]
//! curl http://127.0.0.1:8080/v1/chat/completions -H 'Content-Type: application/json' \
//!     -d '{"model": "local", "messages": [{"role": "user", "content": "Hi!"}], "stream": true}'
//!
//! MODEL is a folder (config.json + safetensors + tokenizer.json), a .gguf file such as
//! SmolLM2-135M-Instruct.Q4_1.gguf, or a Hub repo id.

use anyhow::{Context, Result};
use zoo_runtime::device_map::DeviceMap;
use zoo_serve::{ServeOptions, Server};
use zoo_transformers::AutoModelForCausalLM;

fn main() -> Result<()> {
    let mut args = std::env::args().skip(1);
    let model_path = args.next().context("usage: serve MODEL [PORT]")?;
    let port: u16 = args
        .next()
        .map_or(Ok(8080), |p| p.parse())
        .context("PORT")?;
    let model = AutoModelForCausalLM::load_pretrained(&model_path, DeviceMap::Cpu)?;
    // Up to eight sequences at once, as many as memory holds of the KV cache at the model's
    // context; clients call the model "local", no key.
    let options = ServeOptions {
        max_batch: zoo_serve::batch_that_fits(&model, None, 8)?,
        ..ServeOptions::new("local")
    };
    let server = Server::start(model, options)?;
    tokio::runtime::Runtime::new()?.block_on(async move {
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", port)).await?;
        println!("serving on http://{}/v1", listener.local_addr()?);
        let stop = async {
            let _ = tokio::signal::ctrl_c().await;
        };
        server.serve(listener, stop).await?;
        Ok(())
    })
}
