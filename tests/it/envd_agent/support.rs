//! Test support for `envd_agent`: an in-process envd on a temporary Unix
//! socket, a raw HTTP/1.1 client over that socket, and a Connect stream reader.

#![allow(dead_code)]

use std::path::{Path, PathBuf};

use base64::Engine;
use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full, StreamBody, combinators::BoxBody};
use hyper::body::{Frame, Incoming};
use hyper_util::rt::TokioIo;
use sandbox_mcp::connect_rpc::{Envelope, EnvelopeDecoder, FLAG_MESSAGE, encode_envelope};
use sandbox_mcp::local::envd::{self, EnvdOptions};
use serde_json::{Value, json};

pub type ReqBody = BoxBody<Bytes, std::io::Error>;

pub struct TestEnvd {
    pub _dir: tempfile::TempDir,
    pub socket: PathBuf,
    pub server: tokio::task::JoinHandle<anyhow::Result<()>>,
}

impl Drop for TestEnvd {
    fn drop(&mut self) {
        self.server.abort();
    }
}

pub async fn start_envd() -> TestEnvd {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("envd.sock");
    let listener = tokio::net::UnixListener::bind(&socket).unwrap();
    let opts = EnvdOptions {
        sandbox_id: "test-sandbox".into(),
        env_vars: [("SANDBOX_VAR".to_string(), "from-sandbox".to_string())].into(),
        default_user: "root".into(),
        reap_orphans: false,
    };
    let server = tokio::spawn(envd::serve(listener, opts));
    TestEnvd { _dir: dir, socket, server }
}

pub fn full(body: impl Into<Bytes>) -> ReqBody {
    Full::new(body.into()).map_err(|never| match never {}).boxed()
}

/// A chunked body (no Content-Length), delivered in pieces of `piece` bytes.
pub fn chunked(body: Vec<u8>, piece: usize) -> ReqBody {
    let chunks: Vec<Result<Frame<Bytes>, std::io::Error>> =
        body.chunks(piece).map(|c| Ok(Frame::data(Bytes::copy_from_slice(c)))).collect();
    StreamBody::new(futures_util::stream::iter(chunks)).boxed()
}

pub fn basic(user: &str) -> String {
    format!("Basic {}", base64::engine::general_purpose::STANDARD.encode(format!("{user}:")))
}

impl TestEnvd {
    pub async fn send(&self, request: Request<ReqBody>) -> Response<Incoming> {
        let stream = tokio::net::UnixStream::connect(&self.socket).await.unwrap();
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await.unwrap();
        tokio::spawn(conn);
        sender.send_request(request).await.unwrap()
    }

    pub async fn get(&self, uri: &str) -> (StatusCode, http::HeaderMap, Bytes) {
        let response = self.send(Request::get(uri).body(full(Bytes::new())).unwrap()).await;
        let (parts, body) = response.into_parts();
        (parts.status, parts.headers, body.collect().await.unwrap().to_bytes())
    }

    pub async fn unary(&self, method: &str, message: Value, user: Option<&str>) -> (StatusCode, Value) {
        let mut request = Request::post(format!("http://envd/{method}"))
            .header("content-type", "application/json")
            .header("connect-protocol-version", "1");
        if let Some(user) = user {
            request = request.header("authorization", basic(user));
        }
        let response = self.send(request.body(full(serde_json::to_vec(&message).unwrap())).unwrap()).await;
        let status = response.status();
        assert!(response.headers()["content-type"].to_str().unwrap().starts_with("application/json"));
        let body = response.into_body().collect().await.unwrap().to_bytes();
        (status, serde_json::from_slice(&body).unwrap())
    }

    /// Opens a server stream (chunked request body, as the SDK sends it).
    pub async fn open_stream(&self, method: &str, message: Value, headers: &[(&str, &str)]) -> FrameReader {
        let envelope = encode_envelope(FLAG_MESSAGE, &serde_json::to_vec(&message).unwrap()).to_vec();
        self.open_stream_raw(method, envelope, headers).await
    }

    pub async fn open_stream_raw(&self, method: &str, body: Vec<u8>, headers: &[(&str, &str)]) -> FrameReader {
        let mut request = Request::post(format!("http://envd/{method}"))
            .header("content-type", "application/connect+json")
            .header("connect-protocol-version", "1");
        if !headers.iter().any(|(k, _)| k.eq_ignore_ascii_case("keepalive-ping-interval")) {
            request = request.header("keepalive-ping-interval", "50");
        }
        for (k, v) in headers {
            request = request.header(*k, *v);
        }
        let response = self.send(request.body(chunked(body, 7)).unwrap()).await;
        assert_eq!(response.status(), StatusCode::OK);
        assert_eq!(response.headers()["content-type"], "application/connect+json");
        FrameReader { body: response.into_body(), decoder: EnvelopeDecoder::new(), eof: false }
    }

    pub async fn run(&self, script: &str, extra: Value, headers: &[(&str, &str)]) -> RunResult {
        let mut request = json!({"process": {"cmd": "/bin/bash", "args": ["-c", script]}, "stdin": false});
        merge(&mut request, extra);
        let mut reader = self.open_stream("process.Process/Start", request, headers).await;
        reader.collect_run().await
    }
}

pub fn merge(target: &mut Value, extra: Value) {
    if let (Value::Object(t), Value::Object(e)) = (target, extra) {
        for (k, v) in e {
            match (t.get_mut(&k), v) {
                (Some(existing @ Value::Object(_)), v @ Value::Object(_)) => merge(existing, v),
                (_, v) => {
                    t.insert(k, v);
                }
            }
        }
    }
}

pub struct FrameReader {
    pub body: Incoming,
    pub decoder: EnvelopeDecoder,
    pub eof: bool,
}

#[derive(Debug, Default)]
pub struct RunResult {
    pub pid: u64,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    pub end: Option<Value>,
    pub end_stream: Value,
    pub keepalives: usize,
}

impl FrameReader {
    pub async fn next(&mut self) -> Option<Envelope> {
        loop {
            if let Some(envelope) = self.decoder.next_envelope().unwrap() {
                return Some(envelope);
            }
            if self.eof {
                self.decoder.finish().unwrap();
                return None;
            }
            match self.body.frame().await {
                Some(frame) => {
                    if let Ok(data) = frame.unwrap().into_data() {
                        self.decoder.push(&data);
                    }
                }
                None => self.eof = true,
            }
        }
    }

    pub async fn next_json(&mut self) -> (bool, Value) {
        let envelope = self.next().await.expect("stream ended early");
        (envelope.is_end_stream(), serde_json::from_slice(&envelope.payload).unwrap())
    }

    /// Reads frames until the end-stream frame, checking the Connect/E2B event order.
    pub async fn collect_run(&mut self) -> RunResult {
        let mut result = RunResult::default();
        let mut first = true;
        while let Some(envelope) = self.next().await {
            let value: Value = serde_json::from_slice(&envelope.payload).unwrap();
            if envelope.is_end_stream() {
                result.end_stream = value;
                assert!(self.next().await.is_none(), "frames after the end-stream frame");
                return result;
            }
            let event = &value["event"];
            if first {
                first = false;
                result.pid = event["start"]["pid"].as_u64().expect("first event must be start");
                continue;
            }
            assert!(result.end.is_none(), "event after end: {value}");
            let b64 = |v: &Value| base64::engine::general_purpose::STANDARD.decode(v.as_str().unwrap()).unwrap();
            if let Some(data) = event.get("data") {
                if let Some(out) = data.get("stdout") {
                    result.stdout.extend(b64(out));
                } else if let Some(err) = data.get("stderr") {
                    result.stderr.extend(b64(err));
                } else {
                    panic!("empty data event {value}");
                }
            } else if let Some(end) = event.get("end") {
                result.end = Some(end.clone());
            } else if event.get("keepalive").is_some() {
                result.keepalives += 1;
            } else {
                panic!("unexpected event {value}");
            }
        }
        panic!("stream ended without an end-stream frame");
    }
}

pub fn multipart(parts: &[(&str, &[u8])]) -> (String, Vec<u8>) {
    let boundary = "----envdtestboundary7MA4YWxkTrZu0gW";
    let mut body = Vec::new();
    for (filename, data) in parts {
        body.extend_from_slice(format!("--{boundary}\r\n").as_bytes());
        body.extend_from_slice(
            format!("Content-Disposition: form-data; name=\"file\"; filename=\"{filename}\"\r\n").as_bytes(),
        );
        body.extend_from_slice(b"Content-Type: application/octet-stream\r\n\r\n");
        body.extend_from_slice(data);
        body.extend_from_slice(b"\r\n");
    }
    body.extend_from_slice(format!("--{boundary}--\r\n").as_bytes());
    (format!("multipart/form-data; boundary={boundary}"), body)
}

pub fn enc(path: &Path) -> String {
    url::form_urlencoded::byte_serialize(path.to_str().unwrap().as_bytes()).collect()
}

pub async fn upload(envd: &TestEnvd, uri: String, content_type: &str, body: ReqBody) -> (StatusCode, Value) {
    let request = Request::post(uri).header("content-type", content_type).body(body).unwrap();
    let response = envd.send(request).await;
    let status = response.status();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    (status, serde_json::from_slice(&body).unwrap_or(Value::Null))
}

impl FrameReader {
    pub async fn collect_run_after_start(&mut self) -> RunResult {
        // Like collect_run, for a stream whose start event was already read.
        let mut result = RunResult { pid: 1, ..Default::default() };
        while let Some(envelope) = self.next().await {
            let value: Value = serde_json::from_slice(&envelope.payload).unwrap();
            if envelope.is_end_stream() {
                result.end_stream = value;
                return result;
            }
            let event = &value["event"];
            if let Some(out) = event["data"].get("stdout") {
                result.stdout.extend(base64::engine::general_purpose::STANDARD.decode(out.as_str().unwrap()).unwrap());
            } else if let Some(end) = event.get("end") {
                result.end = Some(end.clone());
            }
        }
        panic!("stream ended without an end-stream frame");
    }
}
