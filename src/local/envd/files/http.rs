//! `GET /files` (download, byte ranges) and `POST /files` (upload:
//! multipart/form-data or a raw, optionally gzip-encoded,
//! `application/octet-stream` body, staged by [`super::staged`]), streamed to
//! and from disk, as the requesting user. Errors are envd plain-HTTP JSON `{"code": <status>, "message"}`.

use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use futures_util::StreamExt;
use tokio::io::{AsyncReadExt, AsyncSeekExt};

use super::negotiation::{self, ByteRange, byte_range};

use super::fsops::{io_error, resolve_path, run_as_user};
use super::staged::StagedUpload;
use super::xattrs::{metadata_from_headers, write_metadata};
use crate::connect_rpc::{Code, ConnectError};
use crate::e2b::wire::{ErrorBody, UploadedEntry};
use crate::local::envd::EnvdState;
use crate::local::envd::users::{UserAccount, basic_auth_user, resolve_user};

/// Metadata to store on every uploaded file.
type Metadata = std::collections::BTreeMap<String, String>;

/// Read size of downloads.
const DOWNLOAD_CHUNK: usize = 64 * 1024;

/// An envd plain-HTTP error response.
pub fn http_error(status: StatusCode, message: impl Into<String>) -> Response {
    let body = ErrorBody { code: i32::from(status.as_u16()), message: message.into() };
    let json = serde_json::to_vec(&body).unwrap_or_default();
    (status, [(header::CONTENT_TYPE, HeaderValue::from_static("application/json; charset=utf-8"))], json)
        .into_response()
}

fn from_connect(err: &ConnectError) -> Response {
    let status = match err.code {
        Code::NotFound => StatusCode::NOT_FOUND,
        Code::PermissionDenied => StatusCode::FORBIDDEN,
        Code::InvalidArgument | Code::FailedPrecondition | Code::OutOfRange => StatusCode::BAD_REQUEST,
        Code::Unauthenticated => StatusCode::UNAUTHORIZED,
        Code::ResourceExhausted => StatusCode::INSUFFICIENT_STORAGE,
        Code::AlreadyExists => StatusCode::CONFLICT,
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    };
    http_error(status, err.message.clone())
}

struct FilesQuery {
    path: Option<String>,
    username: Option<String>,
}

fn parse_query(raw: Option<&str>) -> FilesQuery {
    let mut query = FilesQuery { path: None, username: None };
    for (key, value) in url::form_urlencoded::parse(raw.unwrap_or("").as_bytes()) {
        match key.as_ref() {
            "path" if !value.is_empty() => query.path = Some(value.into_owned()),
            "username" if !value.is_empty() => query.username = Some(value.into_owned()),
            _ => {}
        }
    }
    query
}

fn files_user(state: &EnvdState, headers: &HeaderMap, query: &FilesQuery) -> Result<UserAccount, ConnectError> {
    match &query.username {
        Some(name) => resolve_user(name),
        None => match basic_auth_user(headers)? {
            Some(name) => resolve_user(&name),
            None => resolve_user(&state.opts.default_user),
        },
    }
}

/// `GET /files?path=&username=`.
pub async fn download(State(state): State<Arc<EnvdState>>, request: Request) -> Response {
    let query = parse_query(request.uri().query());
    let user = match files_user(&state, request.headers(), &query) {
        Ok(user) => user,
        Err(err) => return from_connect(&err),
    };
    let Some(raw_path) = query.path.as_deref() else {
        return http_error(StatusCode::BAD_REQUEST, "query parameter 'path' is required");
    };
    let path = match resolve_path(&user, raw_path) {
        Ok(path) => path,
        Err(err) => return from_connect(&err),
    };
    let opened = {
        let path = path.clone();
        run_as_user(&user, move || {
            // O_NONBLOCK: opening a FIFO must not hang; it is refused below anyway.
            let file = std::fs::OpenOptions::new()
                .read(true)
                .custom_flags(libc::O_NONBLOCK)
                .open(&path)
                .map_err(|e| io_error(&path, &e))?;
            let meta = file.metadata().map_err(|e| io_error(&path, &e))?;
            if !meta.is_file() {
                let what = if meta.is_dir() { "a directory" } else { "not a regular file" };
                return Err(ConnectError::new(Code::InvalidArgument, format!("path '{}' is {what}", path.display())));
            }
            Ok((file, meta.len()))
        })
        .await
    };
    let (file, size) = match opened.and_then(|r| r) {
        Ok(opened) => opened,
        Err(err) => return from_connect(&err),
    };
    let headers = request.headers();
    let gzip = match negotiation::response_is_gzip(headers) {
        Ok(gzip) => gzip,
        Err(err) => {
            return http_error(StatusCode::BAD_REQUEST, format!("error parsing Accept-Encoding: {err}"));
        }
    };
    // As envd: a range or conditional request is answered uncompressed.
    let ranged = [header::RANGE, header::IF_MODIFIED_SINCE, header::IF_NONE_MATCH, header::IF_RANGE]
        .iter()
        .any(|name| headers.contains_key(name));
    let mut response = if gzip && !ranged {
        let mut response = Response::new(negotiation::gzip(tokio::fs::File::from_std(file), DOWNLOAD_CHUNK));
        response.headers_mut().insert(header::CONTENT_ENCODING, HeaderValue::from_static("gzip"));
        response
    } else {
        let range = headers.get(header::RANGE).map(|v| v.to_str().unwrap_or(""));
        let (status, start, len) = match byte_range(range, size) {
            ByteRange::Whole => (StatusCode::OK, 0, size),
            ByteRange::Part { start, len } => (StatusCode::PARTIAL_CONTENT, start, len),
            ByteRange::NoOverlap => {
                let mut response = http_error(StatusCode::RANGE_NOT_SATISFIABLE, "requested range not satisfiable");
                if let Ok(value) = HeaderValue::from_str(&format!("bytes */{size}")) {
                    response.headers_mut().insert(header::CONTENT_RANGE, value);
                }
                return response;
            }
            ByteRange::Invalid => return http_error(StatusCode::RANGE_NOT_SATISFIABLE, "invalid range"),
        };
        let mut file = tokio::fs::File::from_std(file);
        if start > 0
            && let Err(err) = file.seek(std::io::SeekFrom::Start(start)).await
        {
            return from_connect(&io_error(&path, &err));
        }
        let stream = tokio_util::io::ReaderStream::with_capacity(file.take(len), DOWNLOAD_CHUNK);
        let mut response = Response::new(Body::from_stream(stream));
        *response.status_mut() = status;
        let headers = response.headers_mut();
        headers.insert(header::CONTENT_LENGTH, HeaderValue::from(len));
        headers.insert(header::ACCEPT_RANGES, HeaderValue::from_static("bytes"));
        if status == StatusCode::PARTIAL_CONTENT
            && let Ok(value) = HeaderValue::from_str(&format!("bytes {start}-{}/{size}", start + len - 1))
        {
            headers.insert(header::CONTENT_RANGE, value);
        }
        response
    };
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(mime_for(&path)));
    headers.insert(header::VARY, HeaderValue::from_static("Accept-Encoding"));
    if let Ok(value) = HeaderValue::from_str(&content_disposition(&path)) {
        headers.insert(header::CONTENT_DISPOSITION, value);
    }
    response
}

/// `POST /files?path=&username=`.
pub async fn upload(State(state): State<Arc<EnvdState>>, request: Request) -> Response {
    let query = parse_query(request.uri().query());
    let user = match files_user(&state, request.headers(), &query) {
        Ok(user) => user,
        Err(err) => return from_connect(&err),
    };
    let gzip = match negotiation::request_is_gzip(request.headers()) {
        Ok(gzip) => gzip,
        Err(err) => return http_error(StatusCode::BAD_REQUEST, err.to_string()),
    };
    // As envd: the coding applies to the whole body, multipart included.
    let request = if gzip { request.map(negotiation::gunzip) } else { request };
    let headers = request.headers();
    let metadata = match metadata_from_headers(headers) {
        Ok(metadata) => metadata,
        Err(err) => return from_connect(&err),
    };
    let content_type = headers.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or("").to_owned();
    let essence = content_type.split(';').next().unwrap_or("").trim().to_ascii_lowercase();
    let result = if essence == "multipart/form-data" {
        match multer::parse_boundary(&content_type) {
            Ok(boundary) => {
                // The parser stops at the closing boundary; what follows it (the CRLF every
                // client sends) is read to the end before the answer, else the connection is
                // closed with it unread and a client still writing it sees a reset.
                let (body, drained) = drained_after(request.into_body());
                let multipart = multer::Multipart::new(body, boundary);
                let result = upload_multipart(&user, query.path.as_deref(), multipart, &metadata).await;
                let _ = tokio::time::timeout(DRAIN_TIMEOUT, drained).await;
                result
            }
            Err(err) => Err(ConnectError::new(Code::InvalidArgument, format!("invalid multipart request: {err}"))),
        }
    } else if essence.is_empty() || essence == "application/octet-stream" {
        match query.path.as_deref() {
            Some(raw) => upload_raw(&user, raw, request.into_body(), gzip, &metadata).await.map(|entry| vec![entry]),
            None => Err(ConnectError::new(
                Code::InvalidArgument,
                "query parameter 'path' is required for application/octet-stream uploads",
            )),
        }
    } else {
        Err(ConnectError::new(
            Code::InvalidArgument,
            format!("unsupported Content-Type '{content_type}': use multipart/form-data or application/octet-stream"),
        ))
    };
    match result {
        Ok(entries) => {
            let json = serde_json::to_vec(&entries).unwrap_or_default();
            (StatusCode::OK, [(header::CONTENT_TYPE, HeaderValue::from_static("application/json"))], json)
                .into_response()
        }
        Err(err) => from_connect(&err),
    }
}

/// How long an answer waits for the rest of a multipart body once its parts are read.
const DRAIN_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// `body` as a stream for the multipart parser, and a task that, once the parser lets go of the
/// stream, reads what is left of the body and drops it; it ends at the body's end.
fn drained_after(
    body: Body,
) -> (tokio_stream::wrappers::ReceiverStream<Result<bytes::Bytes, axum::Error>>, tokio::task::JoinHandle<()>) {
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    let pump = tokio::spawn(async move {
        let mut data = body.into_data_stream();
        let mut parser = Some(tx);
        while let Some(chunk) = data.next().await {
            let failed = chunk.is_err();
            if let Some(sender) = &parser
                && sender.send(chunk).await.is_err()
            {
                parser = None;
            }
            if failed {
                break;
            }
        }
    });
    (tokio_stream::wrappers::ReceiverStream::new(rx), pump)
}

async fn upload_multipart(
    user: &UserAccount,
    query_path: Option<&str>,
    mut multipart: multer::Multipart<'static>,
    metadata: &Metadata,
) -> Result<Vec<UploadedEntry>, ConnectError> {
    let bad = |err: multer::Error| ConnectError::new(Code::InvalidArgument, format!("invalid multipart body: {err}"));
    let mut uploaded = Vec::new();
    while let Some(mut field) = multipart.next_field().await.map_err(bad)? {
        if field.name() != Some("file") {
            continue;
        }
        let Some(raw) = query_path.map(str::to_owned).or_else(|| field.file_name().map(str::to_owned)) else {
            return Err(ConnectError::new(
                Code::InvalidArgument,
                "a 'file' part has no filename and the query has no 'path'",
            ));
        };
        let path = resolve_path(user, &raw)?;
        let mut upload = StagedUpload::begin(user, &path).await?;
        while let Some(chunk) = field.chunk().await.map_err(bad)? {
            upload.write(&chunk).await?;
        }
        upload.commit(user).await?;
        uploaded.push(finish_upload(user, &path, metadata).await?);
    }
    if uploaded.is_empty() {
        return Err(ConnectError::new(Code::InvalidArgument, "the multipart body has no part named 'file'"));
    }
    Ok(uploaded)
}

/// Streams a raw body (already gunzipped when it was gzip) into the file.
async fn upload_raw(
    user: &UserAccount,
    raw: &str,
    body: Body,
    gzip: bool,
    metadata: &Metadata,
) -> Result<UploadedEntry, ConnectError> {
    let path = resolve_path(user, raw)?;
    let mut upload = StagedUpload::begin(user, &path).await?;
    let what = if gzip { "reading or gunzipping the upload body failed" } else { "reading the upload body failed" };
    let mut stream = body.into_data_stream();
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(|err| ConnectError::new(Code::InvalidArgument, format!("{what}: {err}")))?;
        upload.write(&chunk).await?;
    }
    upload.commit(user).await?;
    finish_upload(user, &path, metadata).await
}

/// Stores the metadata (if any) on a written file and builds its response item.
async fn finish_upload(user: &UserAccount, path: &Path, metadata: &Metadata) -> Result<UploadedEntry, ConnectError> {
    let entry = uploaded_entry(path);
    if metadata.is_empty() {
        return Ok(entry);
    }
    let (target, stored) = (path.to_path_buf(), metadata.clone());
    run_as_user(user, move || {
        write_metadata(&target, &stored).map_err(|err| {
            if err.raw_os_error() == Some(libc::ENOTSUP) {
                ConnectError::new(
                    Code::InvalidArgument,
                    format!("file metadata is not supported on the filesystem of '{}'", target.display()),
                )
            } else {
                io_error(&target, &err)
            }
        })
    })
    .await??;
    Ok(UploadedEntry { metadata: Some(metadata.clone()), ..entry })
}

fn uploaded_entry(path: &Path) -> UploadedEntry {
    UploadedEntry {
        path: path.to_string_lossy().into_owned(),
        name: path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default(),
        entry_type: "file".into(),
        metadata: None,
    }
}

/// `inline; filename=...` (RFC 6266; non-token names use `filename*`).
fn content_disposition(path: &Path) -> String {
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let is_token = !name.is_empty() && name.bytes().all(|b| b.is_ascii_alphanumeric() || b"!#$&+-.^_`|~".contains(&b));
    if is_token {
        format!("inline; filename={name}")
    } else {
        let encoded = percent_encoding::utf8_percent_encode(&name, percent_encoding::NON_ALPHANUMERIC);
        format!("inline; filename*=utf-8''{encoded}")
    }
}

/// MIME type by file extension.
fn mime_for(path: &Path) -> &'static str {
    let ext = path.extension().and_then(|e| e.to_str()).unwrap_or("").to_ascii_lowercase();
    match ext.as_str() {
        "txt" | "log" | "md" | "csv" | "ini" | "cfg" | "conf" | "toml" | "yaml" | "yml" | "py" | "rs" | "sh" | "c"
        | "h" | "go" => "text/plain; charset=utf-8",
        "html" | "htm" => "text/html; charset=utf-8",
        "css" => "text/css; charset=utf-8",
        "js" | "mjs" => "text/javascript; charset=utf-8",
        "json" => "application/json",
        "xml" => "application/xml",
        "pdf" => "application/pdf",
        "png" => "image/png",
        "jpg" | "jpeg" => "image/jpeg",
        "gif" => "image/gif",
        "svg" => "image/svg+xml",
        "webp" => "image/webp",
        "zip" => "application/zip",
        "gz" | "tgz" => "application/gzip",
        "tar" => "application/x-tar",
        "wasm" => "application/wasm",
        _ => "application/octet-stream",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn disposition_and_mime() {
        assert_eq!(content_disposition(Path::new("/a/b.txt")), "inline; filename=b.txt");
        assert_eq!(content_disposition(Path::new("/a/my file")), "inline; filename*=utf-8''my%20file");
        assert_eq!(mime_for(Path::new("x.PNG")), "image/png");
        assert_eq!(mime_for(Path::new("x.bin")), "application/octet-stream");
    }

    #[test]
    fn query_parsing_ignores_unknown_and_empty() {
        let q = parse_query(Some("path=%2Ftmp%2Fa%20b&username=&signature=x"));
        assert_eq!(q.path.as_deref(), Some("/tmp/a b"));
        assert_eq!(q.username, None);
    }
}
