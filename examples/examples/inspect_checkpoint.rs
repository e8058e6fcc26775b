//! Resolve a model (folder, file or `org/name`), read its config and inventory from headers, and
//! load one tensor as f32.
//!
//! cargo run -p zoo-examples --example inspect_checkpoint -- path/to/all-MiniLM-L6-v2

use zoo_hub::{Pretrained, Weights};

fn main() -> anyhow::Result<()> {
    let input = std::env::args()
        .nth(1)
        .ok_or_else(|| anyhow::anyhow!("usage: inspect_checkpoint <folder | file | org/name>"))?;
    let model = Pretrained::open(&input)?;

    let config = model.config()?;
    println!("architectures: {:?}", config.architectures);
    println!("hidden_size: {:?}", config.hidden_size);

    // Headers only: this is how zoo sizes a deployment before reading any weights.
    let checkpoint = model.checkpoint()?;
    println!(
        "{} tensors, {} bytes in {} file(s)",
        checkpoint.inventory.len(),
        checkpoint.inventory.total_bytes(),
        checkpoint.files.len()
    );

    // Map the files and read the first tensor, converted to f32 on load.
    let weights = Weights::open(checkpoint.inventory)?;
    if let Some(first) = weights.inventory().tensors().first() {
        let values = weights.load_f32(&first.name)?;
        println!(
            "{} {:?}: first values {:?}",
            first.name,
            first.shape,
            &values[..values.len().min(4)]
        );
    }
    Ok(())
}
