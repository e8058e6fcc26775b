//! Ask a vision-language model (LLaVA: `LlavaForConditionalGeneration`) about an image: the
//! chat template puts the image before the question, the processor turns the file into pixel
//! values, and the answer streams as it is generated.
//!
//! cargo run -p zoo-examples --example describe_image -- llava-hf/llava-1.5-7b-hf cat.png \
//!     "What is in this picture?"

use std::io::Write;

use zoo_runtime::device_map::DeviceMap;
use zoo_transformers::vision::open_images;
use zoo_transformers::{AutoModelForImageTextToText, GenerationOptions, Message};

fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let (Some(model), Some(image), Some(question)) = (args.next(), args.next(), args.next()) else {
        anyhow::bail!("usage: describe_image <model> <image> <question>");
    };
    let vlm = AutoModelForImageTextToText::load_pretrained(&model, DeviceMap::Cpu)?;
    let images = open_images(&[image])?;
    let prompt = vlm.apply_chat_template(&[Message::new("user", question).with_images(1)])?;
    let opts = GenerationOptions {
        max_new_tokens: 64,
        ..vlm.default_options()
    };
    let (_, stats) = vlm.generate_with_images(&prompt, &images, &opts, |piece| {
        print!("{piece}");
        let _ = std::io::stdout().flush();
    })?;
    println!("\n({:.1} s to the first token)", stats.time_to_first_token);
    Ok(())
}
