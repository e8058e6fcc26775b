//! zoo-hub benchmarks (release): `cargo bench -p zoo-hub`. Prints each figure beside its target
//! as a ratio; needs ZOO_MINILM_DIR (exported by scripts/fetch-test-assets.sh) for the MiniLM part.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use zoo_hub::{Pretrained, Weights};

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

/// A 30-shard checkpoint with 2,000 tensors of 64 f16 values, headers and index as HF writes them.
fn write_synthetic(dir: &Path) {
    let shards = 30;
    let mut weight_map = BTreeMap::new();
    for s in 0..shards {
        let file = format!("model-{:05}-of-{shards:05}.safetensors", s + 1);
        let mut header = serde_json::Map::new();
        let mut offset = 0u64;
        let names: Vec<String> = (0..2000)
            .filter(|i| i % shards == s)
            .map(|i| format!("model.layers.{}.mlp.w{}.weight", i / 20, i % 20))
            .collect();
        for n in &names {
            header.insert(
                n.clone(),
                serde_json::json!({"dtype": "F16", "shape": [8, 8], "data_offsets": [offset, offset + 128]}),
            );
            weight_map.insert(n.clone(), file.clone());
            offset += 128;
        }
        let h = serde_json::to_vec(&header).unwrap();
        let mut bytes = (h.len() as u64).to_le_bytes().to_vec();
        bytes.extend_from_slice(&h);
        bytes.resize(bytes.len() + offset as usize, 0);
        std::fs::write(dir.join(file), bytes).unwrap();
    }
    let index = serde_json::json!({"metadata": {}, "weight_map": weight_map});
    std::fs::write(
        dir.join("model.safetensors.index.json"),
        serde_json::to_vec(&index).unwrap(),
    )
    .unwrap();
}

fn vm_hwm_kib() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

fn main() {
    // A child run measures peak RSS of a load in a fresh process (see below).
    let args: Vec<String> = std::env::args().collect();
    if let Some(pos) = args.iter().position(|a| a == "--rss-child") {
        let dir = &args[pos + 1];
        let before = vm_hwm_kib().unwrap_or(0);
        let w = Weights::open(
            Pretrained::open(dir)
                .unwrap()
                .checkpoint()
                .unwrap()
                .inventory,
        )
        .unwrap();
        let names: Vec<String> = w
            .inventory()
            .tensors()
            .iter()
            .map(|t| t.name.clone())
            .collect();
        let kept: Vec<Vec<f32>> = names.iter().map(|n| w.load_f32(n).unwrap()).collect();
        let after = vm_hwm_kib().unwrap_or(0);
        println!(
            "{before} {after} {}",
            kept.iter().map(Vec::len).sum::<usize>()
        );
        return;
    }

    let dir = tempfile::tempdir().unwrap();
    write_synthetic(dir.path());
    let model = Pretrained::open(dir.path().to_str().unwrap()).unwrap();
    let runs: Vec<Duration> = (0..10)
        .map(|_| {
            let t = Instant::now();
            let ck = model.checkpoint().unwrap();
            assert_eq!(ck.inventory.len(), 2000);
            t.elapsed()
        })
        .collect();
    let inv = median(runs);
    println!(
        "inventory of 30 shards / 2000 tensors: {:.2} ms (target < 50 ms: {:.3}x of the budget)",
        inv.as_secs_f64() * 1e3,
        inv.as_secs_f64() / 0.050
    );

    let Some(minilm) = std::env::var_os("ZOO_MINILM_DIR") else {
        println!(
            "MiniLM figures need ZOO_MINILM_DIR: eval \"$(scripts/fetch-test-assets.sh)\" first"
        );
        return;
    };
    let minilm = minilm.to_string_lossy().to_string();
    let file = Path::new(&minilm).join("model.safetensors");
    let file_len = std::fs::metadata(&file).unwrap().len();
    let _ = std::fs::read(&file).unwrap(); // warm the page cache for both measurements
    let read = median(
        (0..5)
            .map(|_| {
                let t = Instant::now();
                let b = std::fs::read(&file).unwrap();
                std::hint::black_box(b);
                t.elapsed()
            })
            .collect(),
    );
    let load = median(
        (0..5)
            .map(|_| {
                let t = Instant::now();
                let w = Weights::open(
                    Pretrained::open(&minilm)
                        .unwrap()
                        .checkpoint()
                        .unwrap()
                        .inventory,
                )
                .unwrap();
                let n: usize = w
                    .inventory()
                    .tensors()
                    .iter()
                    .map(|t| std::hint::black_box(w.view(t).to_f32().unwrap()).len())
                    .sum();
                std::hint::black_box(n);
                t.elapsed()
            })
            .collect(),
    );
    println!(
        "MiniLM: read file bytes once {:.1} ms; open + every tensor as f32 {:.1} ms: ratio {:.2}x (target <= 1.5x)",
        read.as_secs_f64() * 1e3,
        load.as_secs_f64() * 1e3,
        load.as_secs_f64() / read.as_secs_f64()
    );

    let exe = std::env::current_exe().unwrap();
    let out = std::process::Command::new(exe)
        .args(["--rss-child", &minilm])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let nums: Vec<u64> = text
        .split_whitespace()
        .filter_map(|x| x.parse().ok())
        .collect();
    if let [_before, after, _] = nums[..] {
        println!(
            "MiniLM: peak RSS of a fresh process loading every tensor as f32 (kept): {:.1} MiB for a {:.1} MiB file: {:.2}x (target < 1.2x)",
            after as f64 / 1024.0,
            file_len as f64 / 1048576.0,
            after as f64 * 1024.0 / file_len as f64
        );
    } else {
        println!(
            "peak RSS child failed: {text} {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}
