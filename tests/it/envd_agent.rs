//! Integration tests of the envd agent: `envd::serve` on a temporary Unix
//! socket, driven with real HTTP/1.1 requests (hyper client), real processes
//! and real files. Needs root (user switching); skips loudly otherwise.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code fails loudly

use crate::common;
mod support;

use std::time::{Duration, Instant};

use base64::Engine;
use bytes::Bytes;
use common::{eventually, host_processes_with, require_root};
use http::{Request, StatusCode};
use http_body_util::BodyExt;
use sandbox_mcp::connect_rpc::{FLAG_MESSAGE, encode_envelope};
use serde_json::{Value, json};
use support::*;

mod probes;

// ------------------------------------------------------------------ tests

#[tokio::test]
async fn health_envs_and_metrics() {
    let envd = start_envd().await;
    let (status, _, body) = envd.get("http://envd/health").await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    assert!(body.is_empty());
    let (status, _, body) = envd.get("http://envd/envs").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(serde_json::from_slice::<Value>(&body).unwrap(), json!({"SANDBOX_VAR": "from-sandbox"}));
    let (status, _, body) = envd.get("http://envd/metrics").await;
    assert_eq!(status, StatusCode::OK);
    let metrics: Value = serde_json::from_slice(&body).unwrap();
    assert!(metrics["mem_total"].as_u64().unwrap() > 0);
    assert!(metrics["cpu_count"].as_u64().unwrap() >= 1);
}

#[tokio::test]
async fn start_streams_output_and_exit_codes() {
    require_root!();
    let envd = start_envd().await;
    let ok = envd.run("echo hi", json!({}), &[]).await;
    assert!(ok.pid > 0);
    assert_eq!(ok.stdout, b"hi\n");
    assert_eq!(ok.end.unwrap(), json!({"exited": true, "status": "exit status 0"}));
    assert_eq!(ok.end_stream, json!({}));

    let three = envd.run("echo out; echo err >&2; exit 3", json!({}), &[]).await;
    assert_eq!(three.stdout, b"out\n");
    assert_eq!(three.stderr, b"err\n");
    assert_eq!(
        three.end.unwrap(),
        json!({"exitCode": 3, "exited": true, "status": "exit status 3", "error": "exit status 3"})
    );

    // Children get the default SIGPIPE disposition back (envd itself ignores it).
    let sigpipe = envd.run("yes | head -c 1; echo \" ${PIPESTATUS[0]}\"", json!({}), &[]).await;
    assert_eq!(String::from_utf8_lossy(&sigpipe.stdout), "y 141\n");

    let killed = envd.run("kill -9 $$", json!({}), &[]).await;
    assert_eq!(killed.end.unwrap(), json!({"exitCode": -1, "status": "signal: killed", "error": "signal: killed"}));
}

#[tokio::test]
async fn eight_mib_of_output_is_byte_exact() {
    require_root!();
    let envd = start_envd().await;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("big.bin");
    let data: Vec<u8> = (0..8 * 1024 * 1024u32).map(|i| (i.wrapping_mul(2654435761) >> 13) as u8).collect();
    std::fs::write(&file, &data).unwrap();
    let started = Instant::now();
    let result = envd.run(&format!("cat {}", file.display()), json!({}), &[]).await;
    let elapsed = started.elapsed();
    assert_eq!(result.stdout.len(), data.len());
    assert!(result.stdout == data, "8 MiB output differs");
    assert_eq!(result.end.unwrap()["status"], "exit status 0");
    println!("8 MiB streamed in {elapsed:?}");
}

#[tokio::test]
async fn stdin_input_and_close() {
    require_root!();
    let envd = start_envd().await;
    let request = json!({"process": {"cmd": "cat"}, "stdin": true});
    let mut stream = envd.open_stream("process.Process/Start", request, &[]).await;
    let (_, start) = stream.next_json().await;
    let pid = start["event"]["start"]["pid"].as_u64().unwrap();
    let input = base64::engine::general_purpose::STANDARD.encode("hello\n");
    let (status, body) = envd
        .unary("process.Process/SendInput", json!({"process": {"pid": pid}, "input": {"stdin": input}}), None)
        .await;
    assert_eq!((status, body), (StatusCode::OK, json!({})));
    let (_, data) = stream.next_json().await;
    assert_eq!(data["event"]["data"]["stdout"], "aGVsbG8K");
    let (status, _) = envd.unary("process.Process/CloseStdin", json!({"process": {"pid": pid}}), None).await;
    assert_eq!(status, StatusCode::OK);
    let rest = stream.collect_run_after_start().await;
    assert_eq!(rest.end.unwrap()["status"], "exit status 0");
    // stdin is gone now: the process exited.
    let (status, body) = envd.unary("process.Process/CloseStdin", json!({"process": {"pid": pid}}), None).await;
    assert_eq!((status, body["code"].as_str()), (StatusCode::NOT_FOUND, Some("not_found")));

    // A process started with stdin=false refuses input.
    let request = json!({"process": {"cmd": "sleep", "args": ["5"]}, "stdin": false});
    let mut stream = envd.open_stream("process.Process/Start", request, &[]).await;
    let (_, start) = stream.next_json().await;
    let pid = start["event"]["start"]["pid"].as_u64().unwrap();
    let (status, body) = envd
        .unary("process.Process/SendInput", json!({"process": {"pid": pid}, "input": {"stdin": "eA=="}}), None)
        .await;
    assert_eq!((status, body["code"].as_str()), (StatusCode::BAD_REQUEST, Some("failed_precondition")));
    let (status, body) = envd
        .unary("process.Process/SendInput", json!({"process": {"pid": pid}, "input": {"stdin": "%%%"}}), None)
        .await;
    assert_eq!((status, body["code"].as_str()), (StatusCode::BAD_REQUEST, Some("invalid_argument")));
    let (status, _) = envd
        .unary("process.Process/SendSignal", json!({"process": {"pid": pid}, "signal": "SIGNAL_SIGKILL"}), None)
        .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(stream.collect_run_after_start().await.end.unwrap()["status"], "signal: killed");
}

#[tokio::test]
async fn cwd_env_and_user_switching() {
    require_root!();
    let envd = start_envd().await;
    let script = "pwd; echo \"$FOO $SANDBOX_VAR $USER $HOME\"; id -u; id -g";
    let extra = json!({"process": {"cwd": "/tmp", "envs": {"FOO": "bar"}}});
    let root = envd.run(script, extra.clone(), &[]).await;
    assert_eq!(String::from_utf8_lossy(&root.stdout), "/tmp\nbar from-sandbox root /root\n0\n0\n");

    let auth = basic("nobody");
    let nobody = envd.run(script, extra.clone(), &[("authorization", &auth)]).await;
    let text = String::from_utf8_lossy(&nobody.stdout).into_owned();
    assert!(text.starts_with("/tmp\nbar from-sandbox nobody "), "{text}");
    assert!(text.ends_with("65534\n65534\n"), "{text}");

    let auth = basic("cloudsdk");
    let cloud = envd.run("id -u; pwd", json!({}), &[("authorization", &auth)]).await;
    let home = nix::unistd::User::from_name("cloudsdk").unwrap().unwrap().dir;
    let expected_cwd = if home.is_dir() { home.display().to_string() } else { "/".into() };
    assert_eq!(String::from_utf8_lossy(&cloud.stdout), format!("1000\n{expected_cwd}\n"));

    // nobody cannot read root's home.
    let denied = envd.run("cat /root/.bashrc /etc/shadow", json!({}), &[("authorization", &basic("nobody"))]).await;
    assert_eq!(denied.end.unwrap()["exitCode"], 1);
    assert!(String::from_utf8_lossy(&denied.stderr).contains("Permission denied"));

    let unknown = envd.run("true", json!({}), &[("authorization", &basic("no-such-user"))]).await;
    assert_eq!(unknown.end_stream["error"]["code"], "unauthenticated");
    assert!(unknown.end.is_none());

    let bad_cwd = envd.run("true", json!({"process": {"cwd": "/does/not/exist"}}), &[]).await;
    assert_eq!(bad_cwd.end_stream["error"]["code"], "invalid_argument");
    assert!(bad_cwd.end_stream["error"]["message"].as_str().unwrap().contains("/does/not/exist"));
    // The cwd resolves as file paths do: `~` is the home, `.` and `..` are removed.
    let tilde = envd.run("pwd", json!({"process": {"cwd": "~"}}), &[]).await;
    assert_eq!(String::from_utf8_lossy(&tilde.stdout), "/root\n");
    let dotted = envd.run("pwd", json!({"process": {"cwd": "/tmp/../tmp/."}}), &[]).await;
    assert_eq!(String::from_utf8_lossy(&dotted.stdout), "/tmp\n");
    let not_dir = envd.run("true", json!({"process": {"cwd": "/etc/passwd"}}), &[]).await;
    assert_eq!(not_dir.end_stream["error"]["code"], "invalid_argument");
    assert!(not_dir.end_stream["error"]["message"].as_str().unwrap().contains("not a directory"));

    let bad_env = envd.run("true", json!({"process": {"envs": {"A=B": "x"}}}), &[]).await;
    assert_eq!(bad_env.end_stream["error"]["code"], "invalid_argument");
    assert!(bad_env.end_stream["error"]["message"].as_str().unwrap().contains("A=B"));

    let bad_cmd = envd
        .open_stream("process.Process/Start", json!({"process": {"cmd": "/no/such/binary"}, "stdin": false}), &[])
        .await
        .collect_run()
        .await;
    assert_eq!(bad_cmd.end_stream["error"]["code"], "invalid_argument");
}

#[tokio::test]
async fn background_children_do_not_hold_back_the_end_event() {
    require_root!();
    let envd = start_envd().await;
    let started = Instant::now();
    let script = "(for i in $(seq 40); do echo bg; sleep 0.05; done) & echo fg; exit 5";
    let result = envd.run(script, json!({}), &[]).await;
    assert!(started.elapsed() < Duration::from_millis(2900), "end took {:?}", started.elapsed());
    assert_eq!(result.end.unwrap()["exitCode"], 5);
    assert!(result.stdout.starts_with(b"fg\n") || result.stdout.starts_with(b"bg\n"));
    // A quiet background child holding the pipe delays the end event by ~100 ms only.
    let started = Instant::now();
    let quiet = envd.run("sleep 2.011 & echo done", json!({}), &[]).await;
    assert!(started.elapsed() < Duration::from_millis(1500), "end took {:?}", started.elapsed());
    assert_eq!(quiet.stdout, b"done\n");
    // Let the background children finish before the test ends.
    let finished =
        eventually(Duration::from_secs(10), || async { host_processes_with("sleep 2.011").is_empty() }).await;
    assert!(finished, "the background sleep outlived its 2 s");
}

#[tokio::test]
async fn connect_timeout_kills_the_process_group() {
    require_root!();
    let envd = start_envd().await;
    let started = Instant::now();
    let result = envd.run("sleep 30 & sleep 30; echo never", json!({}), &[("connect-timeout-ms", "300")]).await;
    assert!(started.elapsed() < Duration::from_secs(5), "took {:?}", started.elapsed());
    assert_eq!(result.end.unwrap()["status"], "signal: killed");
    assert!(result.stdout.is_empty());
}

#[tokio::test]
async fn connect_list_signal_and_late_connect() {
    require_root!();
    let envd = start_envd().await;
    let request = json!({
        "process": {"cmd": "/bin/bash", "args": ["-c", "for i in $(seq 300); do echo tick; sleep 0.1; done"]},
        "stdin": false,
        "tag": "ticker"
    });
    let mut first = envd.open_stream("process.Process/Start", request, &[]).await;
    let (_, start) = first.next_json().await;
    let pid = start["event"]["start"]["pid"].as_u64().unwrap();
    drop(first); // disconnecting does not kill the process
    // A fixed wait is the check: nothing shows that envd saw the disconnect, and the process must
    // outlive it. 300 ms is three of the ticker's writes into the dropped stream.
    tokio::time::sleep(Duration::from_millis(300)).await;

    let (status, list) = envd.unary("process.Process/List", json!({}), None).await;
    assert_eq!(status, StatusCode::OK);
    let entry = list["processes"].as_array().unwrap().iter().find(|p| p["pid"] == pid).cloned().unwrap();
    assert_eq!(entry["tag"], "ticker");
    assert_eq!(entry["config"]["cmd"], "/bin/bash");

    let mut live = envd.open_stream("process.Process/Connect", json!({"process": {"pid": pid}}), &[]).await;
    let (_, start) = live.next_json().await;
    assert_eq!(start["event"]["start"]["pid"], pid);
    let (_, data) = live.next_json().await;
    assert_eq!(data["event"]["data"]["stdout"], "dGljawo="); // "tick\n"

    let (status, body) = envd
        .unary("process.Process/SendSignal", json!({"process": {"pid": pid}, "signal": "SIGNAL_SIGHUP"}), None)
        .await;
    assert_eq!((status, body["code"].as_str()), (StatusCode::NOT_IMPLEMENTED, Some("unimplemented")));
    let (status, body) = envd
        .unary("process.Process/SendSignal", json!({"process": {"pid": pid}, "signal": "SIGNAL_SIGTERM"}), None)
        .await;
    assert_eq!((status, body), (StatusCode::OK, json!({})));
    let rest = live.collect_run_after_start().await;
    assert_eq!(rest.end.unwrap()["status"], "signal: terminated");
    assert_eq!(rest.end_stream, json!({}));

    let (_, list) = envd.unary("process.Process/List", json!({}), None).await;
    assert!(list["processes"].as_array().map(|p| p.iter().all(|p| p["pid"] != pid)).unwrap_or(true));

    // Late connect: start, then the stored end event.
    let late = envd.open_stream("process.Process/Connect", json!({"process": {"pid": pid}}), &[]).await;
    let late = { late }.collect_run().await;
    assert_eq!(late.pid, pid);
    assert_eq!(late.end.unwrap()["status"], "signal: terminated");

    let mut missing = envd.open_stream("process.Process/Connect", json!({"process": {"pid": 999_999}}), &[]).await;
    let (is_end, body) = missing.next_json().await;
    assert!(is_end);
    assert_eq!(body, json!({"error": {"code": "not_found", "message": "process with pid 999999 not found"}}));

    let (status, body) = envd
        .unary("process.Process/SendSignal", json!({"process": {"pid": 999_999}, "signal": "SIGNAL_SIGKILL"}), None)
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(body, json!({"code": "not_found", "message": "process with pid 999999 not found"}));
}

#[tokio::test]
async fn files_round_trip_and_errors() {
    require_root!();
    let envd = start_envd().await;
    let dir = tempfile::tempdir().unwrap();
    let text_path = dir.path().join("nested/deeper/hello.txt");
    let (ct, body) = multipart(&[(text_path.to_str().unwrap(), b"hello world")]);
    let (status, listing) = upload(&envd, "http://envd/files".into(), &ct, full(body)).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(listing, json!([{"path": text_path.to_str().unwrap(), "name": "hello.txt", "type": "file"}]));
    let (status, headers, got) = envd.get(&format!("http://envd/files?path={}", enc(&text_path))).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(&got[..], b"hello world");
    assert_eq!(headers["content-disposition"], "inline; filename=hello.txt");
    assert!(headers["content-type"].to_str().unwrap().starts_with("text/plain"));

    // Binary (every byte value) through multipart with an explicit path, overwriting.
    let binary: Vec<u8> = (0..=255u8).cycle().take(70_000).collect();
    let (ct, body) = multipart(&[("ignored-name", &binary)]);
    let uri = format!("http://envd/files?path={}", enc(&text_path));
    let (status, _) = upload(&envd, uri.clone(), &ct, chunked(body, 4096)).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(&envd.get(&uri).await.2[..], &binary[..]);

    // 10 MiB: raw octet-stream (chunked) and multipart.
    let big: Vec<u8> = (0..10 * 1024 * 1024u32).map(|i| (i.wrapping_mul(40503) >> 7) as u8).collect();
    let big_path = dir.path().join("big.bin");
    let uri = format!("http://envd/files?path={}", enc(&big_path));
    let (status, _) = upload(&envd, uri.clone(), "application/octet-stream", chunked(big.clone(), 65536)).await;
    assert_eq!(status, StatusCode::OK);
    let (_, headers, got) = envd.get(&uri).await;
    assert_eq!(headers["content-type"], "application/octet-stream");
    assert!(got[..] == big[..], "10 MiB octet-stream round trip differs");
    let (ct, body) = multipart(&[(big_path.to_str().unwrap(), &big)]);
    std::fs::remove_file(&big_path).unwrap();
    let (status, _) = upload(&envd, "http://envd/files".into(), &ct, full(body)).await;
    assert_eq!(status, StatusCode::OK);
    assert!(std::fs::read(&big_path).unwrap() == big, "10 MiB multipart round trip differs");

    // Two files in one multipart body.
    let (a, b) = (dir.path().join("a.txt"), dir.path().join("b.txt"));
    let (ct, body) = multipart(&[(a.to_str().unwrap(), b"A"), (b.to_str().unwrap(), b"B")]);
    let (status, listing) = upload(&envd, "http://envd/files".into(), &ct, full(body)).await;
    assert_eq!((status, listing.as_array().unwrap().len()), (StatusCode::OK, 2));
    assert_eq!(std::fs::read(&b).unwrap(), b"B");

    // Errors.
    let (status, headers, body) = envd.get(&format!("http://envd/files?path={}", enc(&dir.path().join("nope")))).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(headers["content-type"], "application/json; charset=utf-8");
    let body: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(body["code"], 404);
    assert!(body["message"].as_str().unwrap().contains("nope"));
    let (status, _, _) = envd.get(&format!("http://envd/files?path={}", enc(dir.path()))).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    let (status, _, _) = envd.get(&format!("http://envd/files?path={}&username=ghost", enc(&a))).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    let fifo = dir.path().join("fifo");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o644)).unwrap();
    let (status, _, body) = envd.get(&format!("http://envd/files?path={}", enc(&fifo))).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body:?}");
    let uri = format!("http://envd/files?path={}", enc(&fifo));
    let (status, _) = upload(&envd, uri, "application/octet-stream", full("x")).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    let (status, _, _) = envd.get("http://envd/files?path=%2Ftmp%2Fa%00b").await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    let (status, body) = upload(&envd, "http://envd/files".into(), "application/octet-stream", full("x")).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(body["message"].as_str().unwrap().contains("path"));
}

async fn gzip(data: &[u8]) -> Vec<u8> {
    use tokio::io::AsyncReadExt;
    let mut out = Vec::new();
    async_compression::tokio::bufread::GzipEncoder::new(data).read_to_end(&mut out).await.unwrap();
    out
}

async fn upload_encoded(
    envd: &TestEnvd,
    uri: &str,
    content_type: &str,
    encoding: &str,
    body: Vec<u8>,
) -> (StatusCode, Value) {
    let request = Request::post(uri)
        .header("content-type", content_type)
        .header("content-encoding", encoding)
        .body(full(body))
        .unwrap();
    let response = envd.send(request).await;
    let status = response.status();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    (status, serde_json::from_slice(&body).unwrap_or(Value::Null))
}

#[tokio::test]
async fn gzip_uploads_are_decoded() {
    require_root!();
    let envd = start_envd().await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("unzipped.bin");
    let uri = format!("http://envd/files?path={}", enc(&path));
    let data: Vec<u8> = (0..300_000u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 11) as u8).collect();
    let (status, listing) = upload_encoded(&envd, &uri, "application/octet-stream", "gzip", gzip(&data).await).await;
    assert_eq!(status, StatusCode::OK, "{listing}");
    assert_eq!(listing[0]["path"], path.to_str().unwrap());
    assert!(std::fs::read(&path).unwrap() == data, "gzip upload differs");
    // Concatenated members decode to the concatenation (as Go's gzip.Reader).
    let mut two = gzip(b"first ").await;
    two.extend(gzip(b"second").await);
    let (status, _) = upload_encoded(&envd, &uri, "application/octet-stream", "GZIP", two).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(std::fs::read(&path).unwrap(), b"first second");
    // Corrupt data, an unknown encoding, gzip with multipart: clear 400s.
    let mut corrupt = gzip(&data).await;
    corrupt.truncate(corrupt.len() / 2);
    corrupt.extend_from_slice(&[0xff; 64]);
    let (status, body) = upload_encoded(&envd, &uri, "application/octet-stream", "gzip", corrupt).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert!(body["message"].as_str().unwrap().contains("gunzipping"), "{body}");
    // ... and the failed upload changed nothing: old content, no staging file left.
    assert_eq!(std::fs::read(&path).unwrap(), b"first second");
    let names: Vec<_> = std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(names, ["unzipped.bin"]);
    let (status, body) = upload_encoded(&envd, &uri, "application/octet-stream", "br", b"x".to_vec()).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(body["message"].as_str().unwrap().contains("'br' is not supported"), "{body}");
    // As envd, the coding covers the whole body, a multipart one too.
    let (ct, body) = multipart(&[(path.to_str().unwrap(), b"zipped multipart")]);
    let (status, body) = upload_encoded(&envd, &uri, &ct, "gzip", gzip(&body).await).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(std::fs::read(&path).unwrap(), b"zipped multipart");
}

async fn get_with(envd: &TestEnvd, uri: &str, headers: &[(&str, &str)]) -> (StatusCode, http::HeaderMap, Bytes) {
    let mut request = Request::get(uri);
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let response = envd.send(request.body(full(Vec::new())).unwrap()).await;
    let (status, headers) = (response.status(), response.headers().clone());
    (status, headers, response.into_body().collect().await.unwrap().to_bytes())
}

#[tokio::test]
async fn downloads_are_gzipped_when_asked_unless_ranged() {
    use tokio::io::AsyncReadExt;
    require_root!();
    let envd = start_envd().await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("data.txt");
    let data = "compressible line of text\n".repeat(20_000);
    std::fs::write(&path, &data).unwrap();
    let uri = format!("http://envd/files?path={}", enc(&path));
    // What httpx (the Python SDK) sends by default.
    let (status, headers, body) = get_with(&envd, &uri, &[("accept-encoding", "gzip, deflate")]).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(headers["content-encoding"], "gzip");
    assert_eq!(headers["vary"], "Accept-Encoding");
    assert_eq!(headers["content-type"], "text/plain; charset=utf-8");
    assert_eq!(headers["content-disposition"], "inline; filename=data.txt");
    assert!(body.len() < data.len() / 10, "{} bytes compressed", body.len());
    let mut plain = String::new();
    async_compression::tokio::bufread::GzipDecoder::new(&body[..]).read_to_string(&mut plain).await.unwrap();
    assert!(plain == data, "gunzipped download differs");
    // A range is served uncompressed; so is a request that does not ask for gzip.
    let (status, headers, body) = get_with(&envd, &uri, &[("accept-encoding", "gzip"), ("range", "bytes=0-10")]).await;
    assert_eq!((status, headers.get("content-encoding")), (StatusCode::PARTIAL_CONTENT, None));
    assert_eq!(&body[..], &data.as_bytes()[..11]);
    let (status, headers, body) = get_with(&envd, &uri, &[("accept-encoding", "br;q=1, gzip;q=0")]).await;
    assert_eq!((status, headers.get("content-encoding")), (StatusCode::OK, None));
    assert_eq!(body.len(), data.len());
    assert_eq!(headers["vary"], "Accept-Encoding");
    assert_eq!(headers["content-type"], "text/plain; charset=utf-8");
    assert_eq!(headers["content-disposition"], "inline; filename=data.txt");
    assert_eq!(headers["content-length"], data.len().to_string().as_str());
    // Nothing acceptable: a clear 400, as envd answers.
    let (status, _, body) = get_with(&envd, &uri, &[("accept-encoding", "br, identity;q=0")]).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(String::from_utf8_lossy(&body).contains("Accept-Encoding"));
}

#[tokio::test]
async fn uploads_keep_the_identity_of_what_they_replace() {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    require_root!();
    let envd = start_envd().await;
    let dir = tempfile::tempdir().unwrap();
    let put = |path: &std::path::Path, data: &'static [u8]| {
        let uri = format!("http://envd/files?path={}&username=root", enc(path));
        let envd = &envd;
        async move { upload(envd, uri, "application/octet-stream", full(data)).await.0 }
    };
    // A plain file keeps its permission bits (it is replaced by a rename).
    let script = dir.path().join("run.sh");
    std::fs::write(&script, b"old").unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o751)).unwrap();
    assert_eq!(put(&script, b"#!/bin/sh\n").await, StatusCode::OK);
    assert_eq!(std::fs::read(&script).unwrap(), b"#!/bin/sh\n");
    assert_eq!(std::fs::metadata(&script).unwrap().mode() & 0o7777, 0o751);
    // A symlink stays a symlink; the file it points to gets the data.
    let real = dir.path().join("real.txt");
    let link = dir.path().join("link.txt");
    std::fs::write(&real, b"old").unwrap();
    std::os::unix::fs::symlink(&real, &link).unwrap();
    assert_eq!(put(&link, b"through the link").await, StatusCode::OK);
    assert!(std::fs::symlink_metadata(&link).unwrap().file_type().is_symlink());
    assert_eq!(std::fs::read(&real).unwrap(), b"through the link");
    // Hard links keep sharing one inode.
    let other = dir.path().join("other-name.txt");
    std::fs::hard_link(&real, &other).unwrap();
    assert_eq!(put(&real, b"both names").await, StatusCode::OK);
    assert_eq!(std::fs::read(&other).unwrap(), b"both names");
    // Nothing staged is left behind.
    let mut names: Vec<_> =
        std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    names.sort();
    assert_eq!(names, ["link.txt", "other-name.txt", "real.txt", "run.sh"]);
    // A read-only file of an unprivileged user stays refused, in a directory it may write.
    let own = tempfile::tempdir().unwrap();
    let nobody = nix::unistd::Uid::from_raw(65_534);
    std::os::unix::fs::chown(own.path(), Some(nobody.as_raw()), None).unwrap();
    let locked = own.path().join("locked.txt");
    std::fs::write(&locked, b"keep").unwrap();
    std::os::unix::fs::chown(&locked, Some(nobody.as_raw()), None).unwrap();
    std::fs::set_permissions(&locked, std::fs::Permissions::from_mode(0o444)).unwrap();
    let uri = format!("http://envd/files?path={}&username=nobody", enc(&locked));
    let (status, _) = upload(&envd, uri, "application/octet-stream", full(&b"replaced"[..])).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    assert_eq!(std::fs::read(&locked).unwrap(), b"keep");
    assert_eq!(std::fs::read_dir(own.path()).unwrap().count(), 1, "a staging file was left");
}

/// Entries of `dir`, sorted.
fn dir_names(dir: &std::path::Path) -> Vec<String> {
    let mut names: Vec<_> =
        std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    names.sort();
    names
}

#[tokio::test]
async fn uploads_keep_metadata_and_group_of_what_they_replace() {
    use std::os::unix::fs::MetadataExt;
    require_root!();
    let envd = start_envd().await;
    let dir = tempfile::tempdir().unwrap();
    let base = dir.path().to_str().unwrap().to_owned();
    let put = |path: &std::path::Path, data: &'static str, headers: &'static [(&'static str, &'static str)]| {
        let mut request = Request::post(format!("http://envd/files?path={}&username=root", enc(path)))
            .header("content-type", "application/octet-stream");
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        let envd = &envd;
        async move {
            let response = envd.send(request.body(full(data)).unwrap()).await;
            let status = response.status();
            let body = response.into_body().collect().await.unwrap().to_bytes();
            (status, serde_json::from_slice::<Value>(&body).unwrap_or(Value::Null))
        }
    };
    let stat_metadata = |path: std::path::PathBuf| {
        let envd = &envd;
        async move {
            let (status, stat) =
                envd.unary("filesystem.Filesystem/Stat", json!({"path": path.to_str().unwrap()}), None).await;
            assert_eq!(status, StatusCode::OK, "{stat}");
            stat["entry"]["metadata"].clone()
        }
    };
    // Metadata stored by one upload survives the next upload without it.
    let file = dir.path().join("meta.txt");
    let (status, listing) = put(&file, "first", &[("X-Metadata-k", "v")]).await;
    assert_eq!(status, StatusCode::OK, "{listing}");
    assert_eq!(listing[0]["metadata"], json!({"k": "v"}));
    let (status, listing) = put(&file, "second", &[]).await;
    assert_eq!(status, StatusCode::OK, "{listing}");
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "second");
    assert_eq!(stat_metadata(file.clone()).await, json!({"k": "v"}), "metadata lost by a re-upload");
    let cname = std::ffi::CString::new(file.to_str().unwrap()).unwrap();
    let mut value = [0u8; 16];
    // SAFETY: valid NUL-terminated strings and a buffer of the given length.
    let len = unsafe { libc::getxattr(cname.as_ptr(), c"user.e2b.k".as_ptr(), value.as_mut_ptr().cast(), value.len()) };
    assert_eq!(len, 1, "user.e2b.k is gone: {}", std::io::Error::last_os_error());
    assert_eq!(&value[..1], b"v");
    // A file of another group keeps its group.
    let grouped = dir.path().join("grouped.txt");
    std::fs::write(&grouped, "old").unwrap();
    std::os::unix::fs::chown(&grouped, None, Some(1000)).unwrap();
    assert_eq!(put(&grouped, "new", &[]).await.0, StatusCode::OK);
    assert_eq!(std::fs::read_to_string(&grouped).unwrap(), "new");
    assert_eq!(std::fs::metadata(&grouped).unwrap().gid(), 1000, "the group was replaced");
    // Names up to NAME_MAX work: the staging name is no longer than they are.
    let long = dir.path().join("n".repeat(250));
    let (status, listing) = put(&long, "long", &[]).await;
    assert_eq!(status, StatusCode::OK, "{listing}");
    assert_eq!(std::fs::read_to_string(&long).unwrap(), "long");
    assert_eq!(put(&long, "longer", &[]).await.0, StatusCode::OK);
    assert_eq!(std::fs::read_to_string(&long).unwrap(), "longer");
    // Nothing staged is left behind.
    assert_eq!(dir_names(dir.path()), ["grouped.txt", "meta.txt", "n".repeat(250).as_str()], "in {base}");
}

#[tokio::test]
async fn uploads_write_in_place_where_the_user_cannot_create_files() {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    require_root!();
    let envd = start_envd().await;
    // A root-owned directory nobody may enter but not write, holding a file of nobody.
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let file = dir.path().join("owned-by-nobody.txt");
    std::fs::write(&file, "old content").unwrap();
    std::os::unix::fs::chown(&file, Some(65_534), Some(65_534)).unwrap();
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();
    let inode = std::fs::metadata(&file).unwrap().ino();
    let uri = format!("http://envd/files?path={}&username=nobody", enc(&file));
    let (status, body) = upload(&envd, uri, "application/octet-stream", full("new")).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "new");
    let meta = std::fs::metadata(&file).unwrap();
    assert_eq!((meta.ino(), meta.uid(), meta.mode() & 0o7777), (inode, 65_534, 0o644));
    assert_eq!(dir_names(dir.path()), ["owned-by-nobody.txt"], "a staging file was left");
    // A new file cannot be created there by nobody.
    let uri = format!("http://envd/files?path={}&username=nobody", enc(&dir.path().join("new.txt")));
    let (status, _) = upload(&envd, uri, "application/octet-stream", full("x")).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    assert_eq!(dir_names(dir.path()), ["owned-by-nobody.txt"]);
}

#[tokio::test]
async fn files_run_as_the_requesting_user() {
    require_root!();
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let envd = start_envd().await;
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    let path = dir.path().join("sub/owned.txt");
    let uri = format!("http://envd/files?path={}&username=cloudsdk", enc(&path));
    let (status, _) = upload(&envd, uri, "application/octet-stream", full("mine")).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(std::fs::metadata(&path).unwrap().uid(), 1000);
    assert_eq!(std::fs::metadata(path.parent().unwrap()).unwrap().uid(), 1000);

    // nobody may neither read nor overwrite a root-only file.
    let secret = dir.path().join("secret.txt");
    std::fs::write(&secret, "root only").unwrap();
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).unwrap();
    let (status, _, _) = envd.get(&format!("http://envd/files?path={}&username=nobody", enc(&secret))).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    let uri = format!("http://envd/files?path={}&username=nobody", enc(&secret));
    let (status, _) = upload(&envd, uri, "application/octet-stream", full("overwrite")).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    assert_eq!(std::fs::read_to_string(&secret).unwrap(), "root only");

    // The same rules apply to filesystem RPCs.
    let (status, body) =
        envd.unary("filesystem.Filesystem/Remove", json!({"path": secret.to_str().unwrap()}), Some("nobody")).await;
    assert_eq!(status, StatusCode::OK, "{body}"); // the directory is world-writable (no sticky bit)
    let locked = dir.path().join("locked");
    std::fs::create_dir(&locked).unwrap();
    std::fs::set_permissions(&locked, std::fs::Permissions::from_mode(0o700)).unwrap();
    let (status, body) = envd
        .unary("filesystem.Filesystem/MakeDir", json!({"path": locked.join("x").to_str().unwrap()}), Some("nobody"))
        .await;
    assert_eq!((status, body["code"].as_str()), (StatusCode::FORBIDDEN, Some("permission_denied")));
}

#[tokio::test]
async fn filesystem_rpcs() {
    require_root!();
    let envd = start_envd().await;
    let dir = tempfile::tempdir().unwrap();
    let base = dir.path().to_str().unwrap().to_owned();
    let (status, made) =
        envd.unary("filesystem.Filesystem/MakeDir", json!({"path": format!("{base}/a/b")}), None).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(made["entry"]["type"], "FILE_TYPE_DIRECTORY");
    assert_eq!(made["entry"]["name"], "b");
    assert_eq!(made["entry"]["owner"], "root");
    let (status, body) =
        envd.unary("filesystem.Filesystem/MakeDir", json!({"path": format!("{base}/a/b")}), None).await;
    assert_eq!((status, body["code"].as_str()), (StatusCode::CONFLICT, Some("already_exists")));

    std::fs::write(dir.path().join("a/file.txt"), "12345").unwrap();
    std::os::unix::fs::symlink(dir.path().join("a/file.txt"), dir.path().join("a/link")).unwrap();
    let (status, stat) =
        envd.unary("filesystem.Filesystem/Stat", json!({"path": format!("{base}/a/file.txt")}), None).await;
    assert_eq!(status, StatusCode::OK);
    let entry = &stat["entry"];
    assert_eq!(entry["type"], "FILE_TYPE_FILE");
    assert_eq!(entry["size"], "5");
    assert_eq!(entry["path"], format!("{base}/a/file.txt"));
    assert!(entry["permissions"].as_str().unwrap().starts_with("-rw"));
    assert!(entry["modifiedTime"].as_str().unwrap().ends_with('Z'));
    let (_, link) = envd.unary("filesystem.Filesystem/Stat", json!({"path": format!("{base}/a/link")}), None).await;
    assert_eq!(link["entry"]["isSymlink"], true);
    assert_eq!(link["entry"]["symlinkTarget"], format!("{base}/a/file.txt"));

    let (status, list) = envd.unary("filesystem.Filesystem/ListDir", json!({"path": format!("{base}/a")}), None).await;
    assert_eq!(status, StatusCode::OK);
    let names: Vec<&str> = list["entries"].as_array().unwrap().iter().map(|e| e["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["b", "file.txt", "link"]);
    std::fs::write(dir.path().join("a/b/inner"), "").unwrap();
    let (_, deep) = envd.unary("filesystem.Filesystem/ListDir", json!({"path": base.clone(), "depth": 3}), None).await;
    let paths: Vec<&str> = deep["entries"].as_array().unwrap().iter().map(|e| e["path"].as_str().unwrap()).collect();
    assert!(paths.contains(&format!("{base}/a/b/inner").as_str()), "{paths:?}");
    let (status, body) =
        envd.unary("filesystem.Filesystem/ListDir", json!({"path": format!("{base}/a/file.txt")}), None).await;
    assert_eq!((status, body["code"].as_str()), (StatusCode::BAD_REQUEST, Some("invalid_argument")));

    let (status, moved) = envd
        .unary(
            "filesystem.Filesystem/Move",
            json!({"source": format!("{base}/a/file.txt"), "destination": format!("{base}/c/moved.txt")}),
            None,
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(moved["entry"]["path"], format!("{base}/c/moved.txt"));
    assert_eq!(std::fs::read_to_string(dir.path().join("c/moved.txt")).unwrap(), "12345");

    let (status, body) = envd.unary("filesystem.Filesystem/Remove", json!({"path": format!("{base}/a")}), None).await;
    assert_eq!((status, body), (StatusCode::OK, json!({})));
    assert!(!dir.path().join("a").exists());
    let (status, body) = envd.unary("filesystem.Filesystem/Remove", json!({"path": format!("{base}/a")}), None).await;
    assert_eq!((status, body["code"].as_str()), (StatusCode::NOT_FOUND, Some("not_found")));
    let (status, _) = envd.unary("filesystem.Filesystem/Stat", json!({"path": format!("{base}/zzz")}), None).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (status, body) = envd.unary("filesystem.Filesystem/Remove", json!({"path": "/tmp/../"}), None).await;
    assert_eq!((status, body["code"].as_str()), (StatusCode::BAD_REQUEST, Some("invalid_argument")));
    let (status, body) = envd.unary("filesystem.Filesystem/Stat", json!({"path": "a\u{0}b"}), None).await;
    assert_eq!((status, body["code"].as_str()), (StatusCode::BAD_REQUEST, Some("invalid_argument")));
}

#[tokio::test]
async fn protocol_errors_are_clean() {
    let envd = start_envd().await;
    // Malformed envelope (truncated) and invalid JSON inside a good envelope: error end-stream, HTTP 200.
    let mut truncated = envd.open_stream_raw("process.Process/Start", vec![0, 0, 0, 0, 50, b'{'], &[]).await;
    let (is_end, body) = truncated.next_json().await;
    assert!(is_end);
    assert_eq!(body["error"]["code"], "invalid_argument");
    let bad_json = encode_envelope(FLAG_MESSAGE, b"{\"process\": 5}").to_vec();
    let mut bad = envd.open_stream_raw("process.Process/Start", bad_json, &[]).await;
    assert_eq!(bad.next_json().await.1["error"]["code"], "invalid_argument");
    let huge = vec![0, 0xff, 0xff, 0xff, 0xff, 1, 2, 3];
    let mut huge = envd.open_stream_raw("process.Process/Connect", huge, &[]).await;
    assert_eq!(huge.next_json().await.1["error"]["code"], "invalid_argument");

    // Unary: invalid JSON, unknown method, protobuf content type.
    let request = Request::post("http://envd/process.Process/List")
        .header("content-type", "application/json")
        .body(full("{not json"))
        .unwrap();
    let response = envd.send(request).await;
    assert_eq!(response.status(), StatusCode::BAD_REQUEST);
    let body: Value = serde_json::from_slice(&response.into_body().collect().await.unwrap().to_bytes()).unwrap();
    assert_eq!(body["code"], "invalid_argument");
    let (status, body) = envd.unary("process.Process/Frobnicate", json!({}), None).await;
    assert_eq!((status, body["code"].as_str()), (StatusCode::NOT_IMPLEMENTED, Some("unimplemented")));
    let (status, _) = envd.unary("nope.Service/Method", json!({}), None).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let request = Request::post("http://envd/process.Process/List")
        .header("content-type", "application/proto")
        .body(full(Bytes::new()))
        .unwrap();
    let response = envd.send(request).await;
    assert_eq!(response.status(), StatusCode::UNSUPPORTED_MEDIA_TYPE);
    let body: Value = serde_json::from_slice(&response.into_body().collect().await.unwrap().to_bytes()).unwrap();
    assert!(body["message"].as_str().unwrap().contains("JSON"));
}

#[tokio::test]
async fn keepalives_arrive_at_the_requested_interval() {
    require_root!();
    let envd = start_envd().await;
    let request = json!({"process": {"cmd": "/bin/bash", "args": ["-c", "sleep 2.5"]}, "stdin": false});
    let mut reader = envd.open_stream("process.Process/Start", request, &[("keepalive-ping-interval", "1")]).await;
    let result = reader.collect_run().await;
    assert!(result.keepalives >= 2, "{} keepalives", result.keepalives);
}

#[tokio::test]
async fn latency_of_true() {
    require_root!();
    let envd = start_envd().await;
    let mut samples = Vec::new();
    let mut to_start = Vec::new();
    for _ in 0..50 {
        let request = json!({"process": {"cmd": "/bin/true"}, "stdin": false});
        let started = Instant::now();
        let mut stream = envd.open_stream("process.Process/Start", request, &[]).await;
        let (_, start) = stream.next_json().await;
        assert!(start["event"]["start"]["pid"].as_u64().is_some());
        to_start.push(started.elapsed());
        let result = stream.collect_run_after_start().await;
        samples.push(started.elapsed());
        assert_eq!(result.end.unwrap()["status"], "exit status 0");
    }
    samples.sort();
    to_start.sort();
    let median = samples[samples.len() / 2];
    println!(
        "`true` start->end over the socket: median {median:?}, min {:?}, max {:?}; request->start frame median {:?}",
        samples[0], samples[49], to_start[25]
    );
    assert!(median < Duration::from_millis(200), "median {median:?}");
}
