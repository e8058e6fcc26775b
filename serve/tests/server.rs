//! The server in-process on an ephemeral port, over the real SmolLM2-135M-Instruct (Q4_1
//! GGUF), talked to over TCP as a client would: every route, streaming, the errors OpenAI's
//! clients expect, and requests that arrive while others run producing, token for token,
//! what each produces alone.
//!
//! `ZOO_SMOLLM2_GGUF` names the file; when unset, `scripts/fetch-test-assets.sh` obtains it.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::thread;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use zoo_runtime::device_map::DeviceMap;
use zoo_serve::{ServeOptions, Server};
use zoo_transformers::{AutoModelForCausalLM, GenerationOptions, Message, TextGenerator};

#[path = "../../hub/tests/common/assets.rs"]
mod assets;

fn smollm2() -> TextGenerator {
    let gguf = assets::asset("ZOO_SMOLLM2_GGUF");
    AutoModelForCausalLM::load_pretrained(gguf.to_str().unwrap(), DeviceMap::Cpu)
        .expect("SmolLM2 loads")
}

/// Starts a server over SmolLM2 on 127.0.0.1:0 in a thread of its own and returns its
/// address; it stops with the test process.
fn start(options: ServeOptions) -> SocketAddr {
    start_with(smollm2(), options)
}

fn start_with(model: TextGenerator, options: ServeOptions) -> SocketAddr {
    start_with_served(model.into(), options)
}

fn start_with_served(model: zoo_serve::Served, options: ServeOptions) -> SocketAddr {
    let server = Server::start(model, options).expect("the server starts");
    let (tx, rx) = std::sync::mpsc::channel();
    thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            tx.send(listener.local_addr().unwrap()).unwrap();
            server
                .serve(listener, std::future::pending())
                .await
                .unwrap();
        });
    });
    rx.recv().unwrap()
}

fn options(max_batch: usize) -> ServeOptions {
    ServeOptions {
        max_batch,
        ..ServeOptions::new("smollm2")
    }
}

/// A response: status, headers (lower-cased names) and the body, de-chunked.
struct Response {
    status: u16,
    headers: Vec<(String, String)>,
    body: String,
}

impl Response {
    fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.body))
    }

    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    /// The `data:` payloads of a server-sent event stream.
    fn events(&self) -> Vec<String> {
        self.body
            .lines()
            .filter_map(|l| l.strip_prefix("data: "))
            .map(String::from)
            .collect()
    }
}

/// One HTTP/1.1 request on a fresh connection.
fn http(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> Response {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(300))).unwrap();
    let mut req = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n",
        body.len()
    );
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    req.push_str(body);
    s.write_all(req.as_bytes()).unwrap();
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).unwrap();
    parse(&raw)
}

fn parse(raw: &[u8]) -> Response {
    let text = String::from_utf8_lossy(raw).to_string();
    let (head, rest) = text
        .split_once("\r\n\r\n")
        .expect("a complete response head");
    let mut lines = head.lines();
    let status = lines
        .next()
        .unwrap()
        .split(' ')
        .nth(1)
        .unwrap()
        .parse()
        .unwrap();
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    let chunked = headers
        .iter()
        .any(|(k, v)| k == "transfer-encoding" && v.contains("chunked"));
    let body = if chunked {
        dechunk(rest)
    } else {
        rest.to_string()
    };
    Response {
        status,
        headers,
        body,
    }
}

fn dechunk(mut rest: &str) -> String {
    let mut out = String::new();
    loop {
        let Some((size, after)) = rest.split_once("\r\n") else {
            return out;
        };
        let n = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
        if n == 0 {
            return out;
        }
        out.push_str(&after[..n]);
        rest = &after[n + 2..];
    }
}

fn post(addr: SocketAddr, path: &str, body: &Value) -> Response {
    http(addr, "POST", path, &[], &body.to_string())
}

fn chat_body(content: &str, max_tokens: usize) -> Value {
    json!({
        "model": "smollm2",
        "messages": [{"role": "user", "content": content}],
        "max_tokens": max_tokens,
        "temperature": 0,
    })
}

/// Greedy chat requests `(message, max_tokens)` from threads of their own, request `i` sent
/// `i * gap_ms` after the first; their responses in order.
fn staggered_chats(addr: SocketAddr, asks: &[(&str, usize)], gap_ms: u64) -> Vec<Response> {
    let handles: Vec<_> = asks
        .iter()
        .enumerate()
        .map(|(i, (q, n))| {
            let body = chat_body(q, *n);
            thread::spawn(move || {
                thread::sleep(Duration::from_millis(gap_ms * i as u64));
                post(addr, "/v1/chat/completions", &body)
            })
        })
        .collect();
    handles.into_iter().map(|h| h.join().unwrap()).collect()
}

/// What the model generates alone (greedy) for a chat message.
fn alone(model: &TextGenerator, content: &str, max_tokens: usize) -> String {
    let prompt = model
        .apply_chat_template(&[Message::new("user", content)])
        .unwrap();
    let opts = GenerationOptions {
        max_new_tokens: max_tokens,
        ..model.default_options()
    };
    let opts = GenerationOptions {
        do_sample: false,
        ..opts
    };
    model
        .generate_stream(&prompt, true, &opts, |_| {})
        .unwrap()
        .0
        .text
        .unwrap()
}

#[test]
fn chat_and_completions_answer_as_generate_does_whole_and_streamed() {
    let addr = start(options(4));
    let model = smollm2();
    let question = "What is the capital of France?";
    let expected = alone(&model, question, 24);
    assert!(expected.contains("Paris"), "{expected}");

    let r = post(addr, "/v1/chat/completions", &chat_body(question, 24));
    assert_eq!(r.status, 200, "{}", r.body);
    let v = r.json();
    assert_eq!(v["object"], "chat.completion");
    assert_eq!(v["model"], "smollm2");
    assert_eq!(v["choices"][0]["message"]["role"], "assistant");
    assert_eq!(v["choices"][0]["message"]["content"], expected.as_str());
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    let usage = &v["usage"];
    assert_eq!(
        usage["total_tokens"].as_u64().unwrap(),
        usage["prompt_tokens"].as_u64().unwrap() + usage["completion_tokens"].as_u64().unwrap()
    );

    // Streamed: a role chunk, content deltas, a finish chunk, the usage chunk, [DONE].
    let mut body = chat_body(question, 24);
    body["stream"] = json!(true);
    body["stream_options"] = json!({"include_usage": true});
    let r = post(addr, "/v1/chat/completions", &body);
    assert_eq!(r.status, 200);
    assert!(r
        .header("content-type")
        .unwrap()
        .starts_with("text/event-stream"));
    let events = r.events();
    assert_eq!(events.last().unwrap(), "[DONE]");
    let chunks: Vec<Value> = events[..events.len() - 1]
        .iter()
        .map(|e| serde_json::from_str(e).unwrap())
        .collect();
    assert!(chunks
        .iter()
        .all(|c| c["object"] == "chat.completion.chunk"));
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    let streamed: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .collect();
    assert_eq!(streamed, expected);
    let finish = &chunks[chunks.len() - 2];
    assert_eq!(finish["choices"][0]["finish_reason"], "stop");
    assert_eq!(chunks.last().unwrap()["choices"], json!([]));
    assert_eq!(chunks.last().unwrap()["usage"], v["usage"]);

    // A stop string ends the answer and is left out of it, whole and streamed.
    let cut = expected.find("Paris").unwrap();
    let mut body = chat_body(question, 24);
    body["stop"] = json!(["Paris"]);
    let v = post(addr, "/v1/chat/completions", &body).json();
    assert_eq!(v["choices"][0]["message"]["content"], &expected[..cut]);
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    body["stream"] = json!(true);
    let streamed: String = post(addr, "/v1/chat/completions", &body)
        .events()
        .iter()
        .filter_map(|e| serde_json::from_str::<Value>(e).ok())
        .filter_map(|c| {
            c["choices"][0]["delta"]["content"]
                .as_str()
                .map(String::from)
        })
        .collect();
    assert_eq!(streamed, &expected[..cut]);

    // Completions: two prompts, two choices each, greedy: each choice is its prompt's text
    // alone; `length` when max_tokens ran out.
    let prompts = [
        "The capital of Germany is",
        "Rust is a programming language that",
    ];
    let r = post(
        addr,
        "/v1/completions",
        &json!({"model": "smollm2", "prompt": prompts, "max_tokens": 6, "n": 2, "temperature": 0}),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    let v = r.json();
    assert_eq!(v["object"], "text_completion");
    let choices = v["choices"].as_array().unwrap();
    assert_eq!(choices.len(), 4);
    for (i, c) in choices.iter().enumerate() {
        assert_eq!(c["index"], i);
        let opts = GenerationOptions {
            do_sample: false,
            ..GenerationOptions {
                max_new_tokens: 6,
                ..model.default_options()
            }
        };
        let solo = model.generate_text(prompts[i / 2], &opts).unwrap();
        assert_eq!(c["text"], solo.as_str(), "choice {i}");
        assert_eq!(c["finish_reason"], "length");
    }

    // Sampled choices: choice i of a seeded request is what a request of one choice seeded
    // seed + i samples (vLLM's seeds for the children of a request), whatever its siblings do.
    let sampled = |n: usize, seed: u64| {
        let v = post(
            addr,
            "/v1/completions",
            &json!({"model": "smollm2", "prompt": prompts[0], "max_tokens": 8, "n": n,
                    "temperature": 1.0, "top_p": 0.95, "seed": seed}),
        )
        .json();
        let texts: Vec<String> = v["choices"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["text"].as_str().unwrap().to_string())
            .collect();
        texts
    };
    let three = sampled(3, 40);
    assert_eq!(three.len(), 3);
    for (i, text) in three.iter().enumerate() {
        assert_eq!(
            sampled(1, 40 + i as u64),
            std::slice::from_ref(text),
            "choice {i}"
        );
    }
    assert!(three[0] != three[1] || three[1] != three[2], "{three:?}");

    // logit_bias moves the greedy pick; a frequency penalty changes the answer.
    let word = model.tokenizer().unwrap().encode(" zebra", false).unwrap()[0];
    let v = post(
        addr,
        "/v1/completions",
        &json!({"model": "smollm2", "prompt": "The capital of Germany is", "max_tokens": 3,
                "temperature": 0, "logit_bias": {word.to_string(): 100}}),
    )
    .json();
    let zebras = model.tokenizer().unwrap().decode(&[word; 3], true).unwrap();
    assert_eq!(v["choices"][0]["text"], zebras.as_str());
    let repeat = |penalty: f64| {
        post(
            addr,
            "/v1/completions",
            &json!({"model": "smollm2", "prompt": "1, 1, 1, 1, 1, 1, 1, 1,", "max_tokens": 12,
                    "temperature": 0, "frequency_penalty": penalty}),
        )
        .json()["choices"][0]["text"]
            .as_str()
            .unwrap()
            .to_string()
    };
    let plain = repeat(0.0);
    assert!(plain.starts_with(" 1, 1,"), "{plain:?}");
    assert_ne!(repeat(2.0), plain);

    let models = http(addr, "GET", "/v1/models", &[], "").json();
    assert_eq!(models["data"][0]["id"], "smollm2");
    assert_eq!(http(addr, "GET", "/health", &[], "").status, 200);
    let metrics = http(addr, "GET", "/metrics", &[], "").body;
    for name in [
        "zoo_requests_running",
        "zoo_requests_waiting",
        "zoo_prompt_tokens_total",
        "zoo_generated_tokens_total",
        "zoo_time_to_first_token_seconds_bucket",
        "zoo_inter_token_latency_seconds_count",
    ] {
        assert!(metrics.contains(name), "{name} missing from:\n{metrics}");
    }
}

#[test]
fn requests_that_arrive_while_others_run_get_what_each_gets_alone() {
    let addr = start(options(4));
    let model = smollm2();
    let asks = [
        ("Name three colors.", 20),
        ("What is 2 + 2?", 12),
        ("Write a short greeting.", 16),
        ("What is the largest ocean?", 14),
    ];
    let expected: Vec<String> = asks.iter().map(|(q, n)| alone(&model, q, *n)).collect();
    // Sample the running count while the requests overlap.
    let watching = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
    let watch = {
        let watching = watching.clone();
        thread::spawn(move || {
            let mut most = 0u64;
            while watching.load(std::sync::atomic::Ordering::Relaxed) {
                let m = http(addr, "GET", "/metrics", &[], "").body;
                let running = m
                    .lines()
                    .find_map(|l| l.strip_prefix("zoo_requests_running "))
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(0);
                most = most.max(running);
                thread::sleep(Duration::from_millis(5));
            }
            most
        })
    };
    // Staggered: each joins a batch that is already decoding.
    for (i, r) in staggered_chats(addr, &asks, 60).into_iter().enumerate() {
        assert_eq!(r.status, 200, "{}", r.body);
        assert_eq!(
            r.json()["choices"][0]["message"]["content"],
            expected[i].as_str(),
            "request {i}"
        );
    }
    watching.store(false, std::sync::atomic::Ordering::Relaxed);
    let most = watch.join().unwrap();
    assert!(
        most >= 2,
        "the requests never ran together (most running: {most})"
    );
    // The chat template's system turn opens every prompt: the later requests took it from
    // the prefix cache.
    let metrics = http(addr, "GET", "/metrics", &[], "").body;
    let hits: u64 = metrics
        .lines()
        .find_map(|l| l.strip_prefix("zoo_prefix_cache_hits_total "))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    assert!(hits >= 3, "{metrics}");
    // The paged cache's blocks: a pool, every block back once the requests ended.
    let gauge = |name: &str| -> u64 {
        metrics
            .lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
            .unwrap_or_else(|| panic!("{name} missing:\n{metrics}"))
    };
    assert!(gauge("zoo_kv_blocks_total") > 0, "{metrics}");
    assert_eq!(gauge("zoo_kv_blocks_used"), 0, "{metrics}");
    assert_eq!(gauge("zoo_preemptions_total"), 0, "{metrics}");
}

#[test]
fn bad_requests_get_openai_errors_naming_the_field() {
    let addr = start(ServeOptions {
        context: Some(64),
        ..options(2)
    });
    let error = |r: &Response, status: u16, param: Option<&str>| {
        assert_eq!(r.status, status, "{}", r.body);
        let e = &r.json()["error"];
        assert!(e["message"].as_str().is_some_and(|m| !m.is_empty()));
        assert!(e["type"].is_string());
        if let Some(p) = param {
            assert_eq!(e["param"], p, "{}", r.body);
        }
    };
    let malformed = http(addr, "POST", "/v1/chat/completions", &[], "{\"model\": ");
    error(&malformed, 400, Some("body"));
    let mut body = chat_body("Hi", 4);
    body.as_object_mut().unwrap().remove("messages");
    error(
        &post(addr, "/v1/chat/completions", &body),
        400,
        Some("messages"),
    );
    error(
        &post(addr, "/v1/chat/completions", &chat_body("Hi", 0)),
        400,
        Some("max_tokens"),
    );
    let mut body = chat_body("Hi", 4);
    body["temperature"] = json!("hot");
    error(
        &post(addr, "/v1/chat/completions", &body),
        400,
        Some("temperature"),
    );
    let mut body = chat_body("Hi", 4);
    body["presence_penalty"] = json!(3.0);
    error(
        &post(addr, "/v1/chat/completions", &body),
        400,
        Some("presence_penalty"),
    );
    let mut body = chat_body("Hi", 4);
    body["logit_bias"] = json!({"seven": 1});
    error(
        &post(addr, "/v1/chat/completions", &body),
        400,
        Some("logit_bias"),
    );
    let mut body = chat_body("Hi", 4);
    body["logprobs"] = json!(true);
    error(
        &post(addr, "/v1/chat/completions", &body),
        400,
        Some("logprobs"),
    );
    let mut body = chat_body("Hi", 4);
    body["n"] = json!(3);
    error(&post(addr, "/v1/chat/completions", &body), 400, Some("n"));
    let mut body = chat_body("Hi", 4);
    body["model"] = json!("gpt-4");
    let r = post(addr, "/v1/chat/completions", &body);
    error(&r, 404, Some("model"));
    assert_eq!(r.json()["error"]["code"], "model_not_found");
    let long = "word ".repeat(100);
    error(
        &post(addr, "/v1/chat/completions", &chat_body(&long, 4)),
        400,
        Some("messages"),
    );
    let r = post(
        addr,
        "/v1/completions",
        &json!({"model": "smollm2", "prompt": [1, 2, 99999999], "max_tokens": 2}),
    );
    error(&r, 400, Some("prompt"));
    error(&http(addr, "GET", "/v2/nothing", &[], ""), 404, None);
    // Unknown fields are ignored; the server still answers after every error above.
    let mut body = chat_body("Hi", 3);
    body["some_future_field"] = json!({"x": 1});
    body["user"] = json!("test");
    assert_eq!(post(addr, "/v1/chat/completions", &body).status, 200);
}

#[test]
fn a_key_guards_the_api_and_the_queue_bound_answers_429_then_frees() {
    let addr = start(ServeOptions {
        api_key: Some("s3cret".into()),
        max_waiting: 0,
        ..options(1)
    });
    let body = chat_body("Hi", 3).to_string();
    let r = http(addr, "POST", "/v1/chat/completions", &[], &body);
    assert_eq!(r.status, 401);
    assert_eq!(r.json()["error"]["type"], "authentication_error");
    let wrong = [("Authorization", "Bearer nope")];
    assert_eq!(
        http(addr, "POST", "/v1/chat/completions", &wrong, &body).status,
        401
    );
    assert_eq!(http(addr, "GET", "/v1/models", &[], "").status, 401);
    assert_eq!(http(addr, "GET", "/health", &[], "").status, 200);
    let key = [("Authorization", "Bearer s3cret")];
    assert_eq!(
        http(addr, "POST", "/v1/chat/completions", &key, &body).status,
        200
    );

    // A long streamed request holds the one row; a second request is refused at once.
    let mut long = chat_body("Tell me a long story about a dragon.", 400);
    long["stream"] = json!(true);
    let long = long.to_string();
    let mut stream = TcpStream::connect(addr).unwrap();
    write!(
        stream,
        "POST /v1/chat/completions HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer s3cret\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{long}",
        long.len()
    )
    .unwrap();
    let mut first = [0u8; 512];
    let n = stream.read(&mut first).unwrap();
    assert!(String::from_utf8_lossy(&first[..n]).starts_with("HTTP/1.1 200"));
    let r = http(addr, "POST", "/v1/chat/completions", &key, &body);
    assert_eq!(r.status, 429, "{}", r.body);
    assert_eq!(r.header("retry-after"), Some("1"));
    assert_eq!(r.json()["error"]["type"], "rate_limit_error");

    // The client leaves: its sequence is cancelled and its row freed within a few steps.
    drop(stream);
    let t0 = Instant::now();
    loop {
        let r = http(addr, "POST", "/v1/chat/completions", &key, &body);
        if r.status == 200 {
            break;
        }
        assert_eq!(r.status, 429);
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "the disconnected request still holds its row"
        );
        thread::sleep(Duration::from_millis(20));
    }
    let metrics = http(addr, "GET", "/metrics", &[], "").body;
    assert!(metrics.contains("zoo_requests_running 0"), "{metrics}");
}

#[test]
fn on_the_xla_cpu_plugin_overlapping_requests_get_what_each_gets_alone() {
    let plugin = assets::asset("ZOO_PJRT_CPU_PLUGIN");
    zoo_runtime::lazy::configure(zoo_runtime::PjrtPlatform::Cpu, Some(plugin), Some(4)).unwrap();
    let gguf = assets::asset("ZOO_SMOLLM2_GGUF");
    let model = AutoModelForCausalLM::builder(gguf.to_str().unwrap())
        .device_map(DeviceMap::Pjrt {
            platform: "cpu".into(),
            devices: Some(vec![0]),
        })
        .dtype(zoo_runtime::DType::F32)
        .load()
        .expect("SmolLM2 loads on the plugin");
    let addr = start_with(
        model,
        ServeOptions {
            context: Some(256),
            ..options(2)
        },
    );
    let asks = [("What is the capital of France?", 10), ("Name a color.", 8)];
    let content = |r: Response| {
        assert_eq!(r.status, 200, "{}", r.body);
        r.json()["choices"][0]["message"]["content"]
            .as_str()
            .unwrap()
            .to_string()
    };
    let alone: Vec<String> = asks
        .iter()
        .map(|(q, n)| content(post(addr, "/v1/chat/completions", &chat_body(q, *n))))
        .collect();
    assert!(alone[0].contains("Paris"), "{}", alone[0]);
    for (i, r) in staggered_chats(addr, &asks, 150).into_iter().enumerate() {
        assert_eq!(content(r), alone[i], "request {i}");
    }
}

#[test]
fn a_sentence_encoder_serves_embeddings_as_zoo_embed_computes_them() {
    let dir = assets::asset("ZOO_MINILM_DIR");
    let load = || {
        zoo_transformers::sentence::SentenceEmbedder::load_pretrained(
            dir.to_str().unwrap(),
            Default::default(),
        )
        .expect("all-MiniLM-L6-v2 loads")
    };
    let embedder = load();
    let addr = start_with_served(load().into(), ServeOptions::new("minilm"));
    let sentences = ["A cat sits on the mat.", "Rust is a systems language."];
    let want = embedder.embed(&sentences).unwrap();
    let r = post(
        addr,
        "/v1/embeddings",
        &json!({"model": "minilm", "input": sentences}),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    let v = r.json();
    assert_eq!(v["object"], "list");
    for (i, w) in want.iter().enumerate() {
        let got: Vec<f32> = v["data"][i]["embedding"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_f64().unwrap() as f32)
            .collect();
        assert_eq!(&got, w, "input {i}");
        assert_eq!(v["data"][i]["index"], i);
    }
    let tokens: usize = sentences
        .iter()
        .map(|s| embedder.encode(s).unwrap().len())
        .sum();
    assert_eq!(v["usage"]["prompt_tokens"], tokens);

    // base64: the same float32s, little-endian; token ids embed like their text.
    let ids = embedder.encode(sentences[0]).unwrap();
    let r = post(
        addr,
        "/v1/embeddings",
        &json!({"model": "minilm", "input": [ids], "encoding_format": "base64"}),
    )
    .json();
    let b64 = r["data"][0]["embedding"].as_str().unwrap();
    let alone = embedder.embed(&sentences[..1]).unwrap();
    assert_eq!(unbase64_f32(b64), alone[0]);

    let error = |body: Value, status: u16, param: &str| {
        let r = post(addr, "/v1/embeddings", &body);
        assert_eq!(r.status, status, "{}", r.body);
        assert_eq!(r.json()["error"]["param"], param, "{}", r.body);
    };
    error(json!({"model": "minilm"}), 400, "input");
    error(json!({"model": "minilm", "input": ""}), 400, "input");
    error(
        json!({"model": "minilm", "input": [[1, 99999999]]}),
        400,
        "input",
    );
    error(
        json!({"model": "minilm", "input": "x", "dimensions": 7}),
        400,
        "dimensions",
    );
    error(
        json!({"model": "minilm", "input": "x", "encoding_format": "hex"}),
        400,
        "encoding_format",
    );
    error(
        json!({"model": "minilm", "prompt": "x", "max_tokens": 3}),
        400,
        "input",
    );
    let r = post(addr, "/v1/chat/completions", &chat_body("Hi", 3));
    assert_eq!(r.status, 404, "{}", r.body);
    let mut body = chat_body("Hi", 3);
    body["model"] = json!("minilm");
    let r = post(addr, "/v1/chat/completions", &body);
    assert_eq!(
        (r.status, r.json()["error"]["param"].clone()),
        (400, json!("model"))
    );
}

/// OpenAI's base64 embedding back to its float32s (little-endian).
fn unbase64_f32(s: &str) -> Vec<f32> {
    const ABC: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut bytes = Vec::new();
    for quad in s.as_bytes().chunks(4) {
        let vals: Vec<u32> = quad
            .iter()
            .take_while(|&&c| c != b'=')
            .map(|c| ABC.iter().position(|a| a == c).unwrap() as u32)
            .collect();
        let n = vals.iter().fold(0, |n, v| (n << 6) | v) << (6 * (4 - vals.len()));
        bytes.extend(&n.to_be_bytes()[1..vals.len()]);
    }
    bytes
        .chunks(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect()
}

#[path = "../../transformers/tests/common/reranker.rs"]
mod reranker;

#[test]
fn a_reranker_answers_both_rerank_apis_as_sentence_transformers_ranks() {
    let (dir, want) = (
        reranker::reranker_folder(&assets::asset("ZOO_MINILM_DIR")),
        reranker::expected(),
    );
    let ce = zoo_transformers::sentence::CrossEncoder::load_pretrained(
        dir.path().to_str().unwrap(),
        Default::default(),
    )
    .expect("the reranker loads");
    let addr = start_with_served(ce.into(), ServeOptions::new("reranker"));
    let query = want["query"].as_str().unwrap();
    let docs = want["documents"].as_array().unwrap().clone();
    let order: Vec<u64> = want["rank"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["corpus_id"].as_u64().unwrap())
        .collect();

    // text-embeddings-inference's /rerank: a list, best first; raw scores are the logits.
    let r = post(
        addr,
        "/rerank",
        &json!({"query": query, "texts": docs, "return_text": true}),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    let list = r.json();
    let got: Vec<u64> = list
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x["index"].as_u64().unwrap())
        .collect();
    assert_eq!(got, order);
    for x in list.as_array().unwrap() {
        let i = x["index"].as_u64().unwrap() as usize;
        let score = x["score"].as_f64().unwrap();
        assert!(
            (score - want["scores"][i].as_f64().unwrap()).abs() < 1e-5,
            "{score}"
        );
        assert_eq!(x["text"], docs[i]);
    }
    let raw = post(
        addr,
        "/rerank",
        &json!({"query": query, "texts": docs, "raw_scores": true}),
    )
    .json();
    let first = raw[0]["index"].as_u64().unwrap() as usize;
    assert!(
        (raw[0]["score"].as_f64().unwrap() - want["logits"][first].as_f64().unwrap()).abs() < 1e-5
    );
    assert!(raw[0].get("text").is_none());

    // vLLM's and Jina's /v1/rerank: documents as strings or {"text"}, top_n, usage.
    let mixed: Vec<Value> = docs
        .iter()
        .enumerate()
        .map(|(i, d)| {
            if i % 2 == 0 {
                d.clone()
            } else {
                json!({"text": d})
            }
        })
        .collect();
    let r = post(
        addr,
        "/v1/rerank",
        &json!({"model": "reranker", "query": query, "documents": mixed, "top_n": 2}),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    let v = r.json();
    let results = v["results"].as_array().unwrap();
    assert_eq!(results.len(), 2);
    assert_eq!(results[0]["index"].as_u64().unwrap(), order[0]);
    assert_eq!(results[0]["document"]["text"], docs[order[0] as usize]);
    let tokens: u64 = want["token_counts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_u64().unwrap())
        .sum();
    assert_eq!(v["usage"]["total_tokens"], tokens);

    let error = |path: &str, body: Value, status: u16, param: &str| {
        let r = post(addr, path, &body);
        assert_eq!(r.status, status, "{}", r.body);
        assert_eq!(r.json()["error"]["param"], param, "{}", r.body);
    };
    error("/rerank", json!({"texts": ["a"]}), 400, "query");
    error("/rerank", json!({"query": "q", "texts": []}), 400, "texts");
    error("/rerank", json!({"query": "q", "texts": [1]}), 400, "texts");
    error(
        "/v1/rerank",
        json!({"model": "reranker", "query": "q"}),
        400,
        "documents",
    );
    error(
        "/v1/rerank",
        json!({"model": "other", "query": "q", "documents": ["a"]}),
        404,
        "model",
    );
    error(
        "/v1/rerank",
        json!({"model": "reranker", "query": "q", "documents": ["a"], "top_n": 0}),
        400,
        "top_n",
    );
    // A reranker does not embed.
    error(
        "/v1/embeddings",
        json!({"model": "reranker", "input": "a"}),
        400,
        "model",
    );
}

/// Every `{score, label}` of `got` against the pipeline's row `want` (same order, scores
/// within 1e-5).
fn same_predictions(got: &Value, want: &Value, what: &str) {
    let (got, want) = (got.as_array().unwrap(), want.as_array().unwrap());
    assert_eq!(got.len(), want.len(), "{what}");
    for (g, w) in got.iter().zip(want) {
        assert_eq!(g["label"], w["label"], "{what}");
        let (gs, ws) = (g["score"].as_f64().unwrap(), w["score"].as_f64().unwrap());
        assert!((gs - ws).abs() < 1e-5, "{what}: {gs} vs {ws}");
    }
}

/// A text classifier of several labels (the committed tiny three-label BERT) answers
/// text-embeddings-inference's `/predict` (a text, a pair, a batch of both, raw scores) and
/// vLLM's `/classify` (probabilities in label order, the best label, usage) with the
/// `text-classification` pipeline's scores; a long text is refused until truncated; bad
/// inputs and other routes are refused naming the field.
#[test]
fn a_text_classifier_answers_predict_and_classify_as_the_pipeline_scores() {
    let want: Value = serde_json::from_str(include_str!(
        "../../transformers/tests/data/text_classifier/expected.json"
    ))
    .unwrap();
    let dir =
        reranker::classifier_folder("text_classifier", &assets::asset("ZOO_MINILM_DIR"), |_| {});
    let tc = zoo_transformers::text_classification::TextClassifier::load_pretrained(
        dir.path().to_str().unwrap(),
        Default::default(),
    )
    .expect("the classifier loads");
    let addr = start_with_served(tc.into(), ServeOptions::new("sentiment"));
    let (texts, pairs) = (&want["texts"], &want["pairs"]);

    // /predict: one text is one list, best first.
    let r = post(addr, "/predict", &json!({"inputs": texts[0]}));
    assert_eq!(r.status, 200, "{}", r.body);
    same_predictions(&r.json(), &want["softmax"][0], "one text");
    // A pair alone, then a batch mixing a text and a pair: a list per input.
    let r = post(addr, "/predict", &json!({"inputs": pairs[1]}));
    same_predictions(&r.json(), &want["pairs_softmax"][1], "one pair");
    let r = post(
        addr,
        "/predict",
        &json!({"inputs": [[texts[1]], pairs[0]], "truncate": false}),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    let batch = r.json();
    same_predictions(&batch[0], &want["softmax"][1], "batch text");
    same_predictions(&batch[1], &want["pairs_softmax"][0], "batch pair");
    // Raw scores are the logits.
    let raw = post(
        addr,
        "/predict",
        &json!({"inputs": texts[2], "raw_scores": true}),
    )
    .json();
    let labels = want["labels"].as_array().unwrap();
    for p in raw.as_array().unwrap() {
        let j = labels.iter().position(|l| *l == p["label"]).unwrap();
        let logit = want["logits"][2][j].as_f64().unwrap();
        assert!((p["score"].as_f64().unwrap() - logit).abs() < 1e-5);
    }

    // /classify: probabilities in label order, the best label, usage.
    let r = post(
        addr,
        "/classify",
        &json!({"model": "sentiment", "input": texts}),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    let v = r.json();
    assert_eq!(v["object"], "list");
    assert!(v["id"].as_str().unwrap().starts_with("classify-"));
    for (i, d) in v["data"].as_array().unwrap().iter().enumerate() {
        assert_eq!(d["index"], i);
        assert_eq!(d["num_classes"], 3);
        let row = want["softmax"][i].as_array().unwrap();
        assert_eq!(d["label"], row[0]["label"]);
        for (j, label) in labels.iter().enumerate() {
            let w = row.iter().find(|p| p["label"] == *label).unwrap()["score"]
                .as_f64()
                .unwrap();
            assert!((d["probs"][j].as_f64().unwrap() - w).abs() < 1e-5);
        }
    }
    let tokens = v["usage"]["prompt_tokens"].as_u64().unwrap();
    assert!(tokens > 20 && v["usage"]["total_tokens"] == tokens);
    let raw = post(
        addr,
        "/classify",
        &json!({"model": "sentiment", "input": texts[0], "use_activation": false}),
    )
    .json();
    let logit = want["logits"][0][0].as_f64().unwrap();
    assert!((raw["data"][0]["probs"][0].as_f64().unwrap() - logit).abs() < 1e-5);

    // Past the model's 64 positions: refused, then cut when asked.
    let long = "word ".repeat(100);
    let r = post(addr, "/predict", &json!({"inputs": long}));
    assert_eq!(r.status, 400, "{}", r.body);
    assert!(r.body.contains("truncate"), "{}", r.body);
    let r = post(addr, "/predict", &json!({"inputs": long, "truncate": true}));
    assert_eq!(r.status, 200, "{}", r.body);
    let r = post(
        addr,
        "/classify",
        &json!({"model": "sentiment", "input": long, "truncate_prompt_tokens": 16}),
    );
    assert_eq!(r.json()["usage"]["prompt_tokens"], 16, "{}", r.body);

    let error = |path: &str, body: Value, status: u16, param: &str| {
        let r = post(addr, path, &body);
        assert_eq!(r.status, status, "{}", r.body);
        assert_eq!(r.json()["error"]["param"], param, "{}", r.body);
    };
    error("/predict", json!({}), 400, "inputs");
    error("/predict", json!({"inputs": []}), 400, "inputs");
    error("/predict", json!({"inputs": 3}), 400, "inputs");
    error(
        "/predict",
        json!({"inputs": [["a", "b", "c"]]}),
        400,
        "inputs",
    );
    error("/predict", json!({"inputs": ["a", ""]}), 400, "inputs");
    error(
        "/predict",
        json!({"inputs": "a", "truncation_direction": "left"}),
        400,
        "truncation_direction",
    );
    error("/classify", json!({"model": "sentiment"}), 400, "input");
    error(
        "/classify",
        json!({"model": "other", "input": "a"}),
        404,
        "model",
    );
    error(
        "/classify",
        json!({"model": "sentiment", "input": [[1, 2]]}),
        400,
        "input",
    );
    error(
        "/classify",
        json!({"model": "sentiment", "input": "a", "truncate_prompt_tokens": 0}),
        400,
        "truncate_prompt_tokens",
    );
    // A classifier neither reranks, embeds nor generates.
    error(
        "/rerank",
        json!({"query": "q", "texts": ["a"]}),
        400,
        "model",
    );
    error(
        "/v1/embeddings",
        json!({"model": "sentiment", "input": "a"}),
        400,
        "model",
    );
    error(
        "/v1/completions",
        json!({"model": "sentiment", "prompt": "a"}),
        400,
        "model",
    );
}

/// A vision-language model (the committed tiny LLaVA with its processor, tokenizer and chat
/// template) answers a chat whose message carries an image as a data: URL with the tokens
/// transformers' processor and `generate` give (`pipeline.json`); two such requests at once
/// get what each gets alone; a URL to fetch, bad base64 and an image for a text-only model
/// are refused naming the part.
#[test]
fn a_vision_language_model_answers_image_chats_as_transformers() {
    use base64::Engine as _;
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let dir = root.join("nightly/fixtures/llava-f32");
    let want: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("pipeline.json")).unwrap()).unwrap();
    let png = std::fs::read(root.join(want["image"].as_str().unwrap())).unwrap();
    let url = format!(
        "data:image/png;base64,{}",
        base64::engine::general_purpose::STANDARD.encode(&png)
    );
    let model =
        AutoModelForCausalLM::load_pretrained(dir.to_str().unwrap(), DeviceMap::Cpu).unwrap();
    let expected = model
        .tokenizer()
        .unwrap()
        .decode(
            &want["generated_ids"]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_u64().unwrap() as u32)
                .collect::<Vec<_>>(),
            true,
        )
        .unwrap();
    let addr = start_with(
        model,
        ServeOptions {
            max_batch: 2,
            ..ServeOptions::new("llava")
        },
    );
    let body = |image: Value| {
        json!({
            "model": "llava",
            "messages": [{"role": "user", "content": [
                {"type": "image_url", "image_url": image},
                {"type": "text", "text": want["question"]},
            ]}],
            "max_tokens": want["max_new_tokens"],
            "min_tokens": want["max_new_tokens"],
            "temperature": 0,
        })
    };
    let asks: Vec<_> = (0..2)
        .map(|_| {
            let b = body(json!({"url": url}));
            thread::spawn(move || post(addr, "/v1/chat/completions", &b))
        })
        .collect();
    for r in asks.into_iter().map(|h| h.join().unwrap()) {
        assert_eq!(r.status, 200, "{}", r.body);
        let v = r.json();
        assert_eq!(
            v["choices"][0]["message"]["content"], expected,
            "{}",
            r.body
        );
    }
    let refused = |image: Value, words: &str| {
        let r = post(addr, "/v1/chat/completions", &body(image));
        assert_eq!(r.status, 400, "{}", r.body);
        let e = &r.json()["error"];
        assert_eq!(e["param"], "messages[0].content[0]", "{}", r.body);
        assert!(e["message"].as_str().unwrap().contains(words), "{}", r.body);
    };
    refused(
        json!({"url": "https://example.com/cat.png"}),
        "fetches no URLs",
    );
    refused(json!({"url": "data:image/png;base64,@@@"}), "base64");
    refused(json!("data:image/png;base64,AAAA"), "");
    // SmolLM2 reads text only.
    let text_only = start(options(1));
    let mut b = body(json!({"url": url}));
    b["model"] = json!("smollm2");
    let r = post(text_only, "/v1/chat/completions", &b);
    assert_eq!(r.status, 400, "{}", r.body);
    assert!(r.body.contains("reads text only"), "{}", r.body);
}
