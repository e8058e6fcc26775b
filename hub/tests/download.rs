//! Downloads through a stand-in Hub on loopback (HF_ENDPOINT): files land in the HF cache layout
//! (blobs, snapshots, refs) that Python shares, missing optional files read as absent, the token
//! is sent, and server errors surface with the repo, revision and file.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use zoo_hub::{HubError, ModelFiles, Pretrained, Source};

const COMMIT: &str = "fedcba9876543210fedcba9876543210fedcba98";

/// A minimal Hub: serves `files` at `/{repo}/resolve/{revision}/{name}` with the headers the
/// client reads (x-repo-commit, etag, content-range), 404 otherwise. Records request headers.
/// Stops by itself after `max_requests` or 60 s.
fn serve(
    repo: &str,
    files: HashMap<String, Vec<u8>>,
    max_requests: usize,
) -> (String, Arc<Mutex<Vec<String>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    let prefix = format!("/{repo}/resolve/main/");
    listener.set_nonblocking(true).unwrap();
    std::thread::spawn(move || {
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut served = 0;
        while served < max_requests && Instant::now() < deadline {
            let Ok((stream, _)) = listener.accept() else {
                std::thread::sleep(Duration::from_millis(5));
                continue;
            };
            stream.set_nonblocking(false).unwrap();
            served += 1;
            let mut reader = BufReader::new(stream.try_clone().unwrap());
            let mut request_line = String::new();
            reader.read_line(&mut request_line).unwrap();
            let mut range_start = 0usize;
            let mut range_end: Option<usize> = None;
            loop {
                let mut line = String::new();
                if reader.read_line(&mut line).unwrap() == 0 || line == "\r\n" {
                    break;
                }
                log.lock().unwrap().push(line.trim().to_string());
                if let Some(r) = line.to_ascii_lowercase().strip_prefix("range: bytes=") {
                    let (a, b) = r.trim().split_once('-').unwrap();
                    range_start = a.parse().unwrap();
                    range_end = b.parse().ok();
                }
            }
            let path = request_line
                .split_whitespace()
                .nth(1)
                .unwrap_or("")
                .to_string();
            let mut out = stream;
            match path.strip_prefix(&prefix).and_then(|name| files.get(name)) {
                Some(body) => {
                    let end = range_end.unwrap_or(body.len() - 1).min(body.len() - 1);
                    let part = &body[range_start..=end];
                    let head = format!(
                        "HTTP/1.1 206 Partial Content\r\nx-repo-commit: {COMMIT}\r\netag: \"e{}\"\r\ncontent-range: bytes {range_start}-{end}/{}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
                        body.len(), body.len(), part.len()
                    );
                    out.write_all(head.as_bytes()).unwrap();
                    out.write_all(part).unwrap();
                }
                None => {
                    out.write_all(
                        b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\nconnection: close\r\n\r\n",
                    )
                    .unwrap();
                }
            }
        }
    });
    (format!("http://{addr}"), seen)
}

fn safetensors_bytes() -> Vec<u8> {
    let header = r#"{"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}"#;
    let mut b = (header.len() as u64).to_le_bytes().to_vec();
    b.extend_from_slice(header.as_bytes());
    b.extend_from_slice(&1.5f32.to_le_bytes());
    b.extend_from_slice(&(-2.0f32).to_le_bytes());
    b
}

#[test]
fn download_fills_the_hf_cache_and_reads_back_offline() {
    let files: HashMap<String, Vec<u8>> = [
        (
            "config.json".to_string(),
            br#"{"architectures":["LlamaForCausalLM"],"model_type":"llama"}"#.to_vec(),
        ),
        ("model.safetensors".to_string(), safetensors_bytes()),
    ]
    .into();
    let (endpoint, seen) = serve("org/remote", files, 40);
    let cache = tempfile::tempdir().unwrap();
    // The endpoint and token come from the environment, as for huggingface_hub; no other test
    // in this binary reads them.
    std::env::set_var("HF_ENDPOINT", &endpoint);
    std::env::set_var("HF_TOKEN", "hf_test_token");
    let online = ModelFiles::new(Source::parse("org/remote").unwrap())
        .with_cache(cache.path().to_path_buf())
        .with_download(true);
    let model = Pretrained::from_files(online);
    assert_eq!(model.config().unwrap().architectures, ["LlamaForCausalLM"]);
    let ck = model.checkpoint().unwrap();
    assert_eq!(ck.inventory.len(), 1);
    // Absent optional files are absent, not errors.
    assert!(model.generation_config().unwrap().is_none());
    assert!(seen
        .lock()
        .unwrap()
        .iter()
        .any(|h| h.eq_ignore_ascii_case("authorization: Bearer hf_test_token")));

    // The layout Python reads: refs/main → commit, snapshots/<commit>/<file> → blobs.
    let repo = cache.path().join("models--org--remote");
    assert_eq!(
        std::fs::read_to_string(repo.join("refs/main"))
            .unwrap()
            .trim(),
        COMMIT
    );
    let snap = repo
        .join("snapshots")
        .join(COMMIT)
        .join("model.safetensors");
    assert_eq!(std::fs::read(&snap).unwrap(), safetensors_bytes());
    assert!(std::fs::read_dir(repo.join("blobs")).unwrap().count() >= 2);

    // Offline, the same repo resolves from the cache alone.
    let offline = ModelFiles::new(Source::parse("org/remote").unwrap())
        .with_cache(cache.path().to_path_buf())
        .with_download(false);
    let w = zoo_hub::Weights::open(
        Pretrained::from_files(offline)
            .checkpoint()
            .unwrap()
            .inventory,
    )
    .unwrap();
    assert_eq!(w.load_f32("w").unwrap(), vec![1.5, -2.0]);

    // A server that does not answer gives a typed download error naming what failed.
    std::env::set_var("HF_ENDPOINT", "http://127.0.0.1:9");
    let dead = ModelFiles::new(Source::parse("org/other@v3").unwrap())
        .with_cache(cache.path().to_path_buf())
        .with_download(true);
    let err = dead.get("config.json").unwrap_err();
    assert!(matches!(err, HubError::Download { .. }), "{err}");
    let msg = err.to_string();
    assert!(
        msg.contains("org/other") && msg.contains("v3") && msg.contains("config.json"),
        "{msg}"
    );
    assert!(
        msg.contains("huggingface-cli download org/other config.json --revision v3"),
        "{msg}"
    );
    std::env::remove_var("HF_ENDPOINT");
    std::env::remove_var("HF_TOKEN");
}
