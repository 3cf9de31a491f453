//! File tools: `read_file`, `write_file`, `list_files`.

use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use bytes::Bytes;
use http::request::Parts;
use rmcp::handler::server::tool::Extension;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::{Json, tool, tool_router};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::args::{
    MAX_FILE_BYTES, MAX_LIST_DEPTH, MAX_LIST_ENTRIES, MAX_LIST_RESPONSE_BYTES, READ_DEFAULT_BYTES, RunAs,
    validate_path, validate_range,
};
use super::calls::CallContext;
use super::error::ToolError;
use super::result_size::{self, MAX_RESULT_BYTES};
use crate::e2b::{CallOptions, E2bError, wire};
use crate::gateway::state::Gateway;

/// How file content is carried in JSON.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Encoding {
    /// UTF-8 text.
    Text,
    /// Standard base64 (for binary content).
    Base64,
}

#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ReadFileArgs {
    /// File path in the sandbox (absolute, or relative to /home/user).
    pub path: String,
    /// Sandbox to read from; omit to use this session's default sandbox.
    #[serde(default)]
    pub sandbox_id: Option<String>,
    /// "text" or "base64". Default: text when the file is valid UTF-8, else base64.
    #[serde(default)]
    pub encoding: Option<Encoding>,
    /// "user" (default) or "root".
    #[serde(default)]
    pub user: Option<RunAs>,
    /// First byte to return (default 0).
    #[serde(default)]
    pub offset: Option<u64>,
    /// Bytes to return from `offset` (default 262144 = 256 KiB, at most 10 MiB). A page is also cut to
    /// keep the answer under the 1 MiB message limit (about 500 KiB of plain text): then truncated is
    /// true and next_offset says where to go on.
    #[serde(default)]
    pub length: Option<u64>,
}

#[derive(Debug, Serialize, JsonSchema)]
pub struct ReadFileResult {
    pub sandbox_id: String,
    pub path: String,
    /// How `content` is encoded: "text" or "base64".
    pub encoding: Encoding,
    pub content: String,
    /// File size in bytes.
    pub size: u64,
    /// Offset of the first byte of `content`.
    pub offset: u64,
    /// Bytes of the file in `content` (before encoding).
    pub length: u64,
    /// True if the file continues past this part: call again with `offset` = `next_offset`.
    pub truncated: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next_offset: Option<u64>,
}

#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct WriteFileArgs {
    /// File path in the sandbox (absolute, or relative to /home/user). Parent directories are created;
    /// an existing file is replaced.
    pub path: String,
    /// The content: text, or base64 when encoding is "base64" (at most 10 MiB decoded).
    pub content: String,
    /// "text" (default) or "base64".
    #[serde(default)]
    pub encoding: Option<Encoding>,
    /// Sandbox to write to; omit to use this session's default sandbox.
    #[serde(default)]
    pub sandbox_id: Option<String>,
    /// "user" (default) or "root": the file's owner.
    #[serde(default)]
    pub user: Option<RunAs>,
}

#[derive(Debug, Serialize, JsonSchema)]
pub struct WriteFileResult {
    pub sandbox_id: String,
    /// The absolute path written.
    pub path: String,
    pub bytes_written: u64,
}

#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ListFilesArgs {
    /// Directory to list (absolute, or relative to /home/user). Default: /home/user.
    #[serde(default)]
    pub path: Option<String>,
    /// How many levels to descend (1-10, default 1 = the directory's own entries).
    #[serde(default)]
    pub depth: Option<u32>,
    /// Sandbox to list in; omit to use this session's default sandbox.
    #[serde(default)]
    pub sandbox_id: Option<String>,
    /// "user" (default) or "root".
    #[serde(default)]
    pub user: Option<RunAs>,
}

#[derive(Debug, Serialize, JsonSchema)]
pub struct FileEntry {
    pub name: String,
    /// Absolute path.
    pub path: String,
    /// "file", "dir", "symlink" or "other".
    #[serde(rename = "type")]
    pub kind: String,
    pub size: i64,
    /// Like "-rw-r--r--".
    pub permissions: String,
    /// RFC 3339.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub modified_time: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub symlink_target: Option<String>,
}

#[derive(Debug, Serialize, JsonSchema)]
pub struct ListFilesResult {
    pub sandbox_id: String,
    pub path: String,
    pub entries: Vec<FileEntry>,
    /// True if the list was cut: past 5000 entries, or to keep the answer under the 1 MiB message limit.
    pub truncated: bool,
}

/// The `read_file` tool's name (its function below must have this name: `tools::tests` checks).
pub const READ_FILE: &str = "read_file";
/// The `write_file` tool's name (its function below must have this name: `tools::tests` checks).
pub const WRITE_FILE: &str = "write_file";
/// The `list_files` tool's name (its function below must have this name: `tools::tests` checks).
pub const LIST_FILES: &str = "list_files";

#[tool_router(router = file_router, vis = "pub(crate)")]
impl Gateway {
    #[tool(description = "Read a file from a sandbox: up to length bytes (default 256 KiB, at most 10 MiB) from \
        offset (default 0); truncated/next_offset tell how to page through a larger file. Returns text when the \
        part is UTF-8, else base64 (force either with encoding). Omit sandbox_id to use the session's default \
        sandbox.")]
    pub async fn read_file(
        &self,
        Parameters(args): Parameters<ReadFileArgs>,
        Extension(parts): Extension<Parts>,
    ) -> Result<Json<ReadFileResult>, String> {
        let call = self.call_context(READ_FILE, &parts)?;
        self.logged_resuming(READ_FILE, &call, args, |args| self.read_file_impl(&call, args)).await
    }

    #[tool(description = "Write a file in a sandbox (creating parent directories, replacing an existing file). \
        content is text, or base64 with encoding \"base64\" (at most 10 MiB decoded). Omit sandbox_id to use \
        the session's default sandbox.")]
    pub async fn write_file(
        &self,
        Parameters(args): Parameters<WriteFileArgs>,
        Extension(parts): Extension<Parts>,
    ) -> Result<Json<WriteFileResult>, String> {
        let call = self.call_context(WRITE_FILE, &parts)?;
        self.logged_resuming(WRITE_FILE, &call, args, |args| self.write_file_impl(&call, args)).await
    }

    #[tool(description = "List a directory in a sandbox (depth 1-10, default 1; at most 5000 entries). \
        Omit sandbox_id to use the session's default sandbox.")]
    pub async fn list_files(
        &self,
        Parameters(args): Parameters<ListFilesArgs>,
        Extension(parts): Extension<Parts>,
    ) -> Result<Json<ListFilesResult>, String> {
        let call = self.call_context(LIST_FILES, &parts)?;
        self.logged_resuming(LIST_FILES, &call, args, |args| self.list_files_impl(&call, args)).await
    }
}

impl Gateway {
    async fn read_file_impl(&self, call: &CallContext, args: ReadFileArgs) -> Result<ReadFileResult, ToolError> {
        validate_path("path", &args.path)?;
        let offset = args.offset.unwrap_or(0);
        let length = args.length.unwrap_or(READ_DEFAULT_BYTES);
        validate_range("length", length, 1, MAX_FILE_BYTES)?;
        let sandbox = self.resolve_sandbox(call, args.sandbox_id.as_deref()).await?;
        self.renew_on_use(&sandbox.id);
        let user = args.user.unwrap_or_default().name();
        let options = CallOptions::user(user);
        // No page can carry more than half the message bound (each byte costs at least 2 as sent).
        let wanted = length.min(MAX_RESULT_BYTES as u64 / 2);
        // Read with the masker's context on each side, so a secret split by a page edge is masked.
        let context = self.core.masker.context();
        let lead = offset.min(context);
        let part = sandbox
            .envd
            .read_file_range(&args.path, offset - lead, lead + wanted + context, &options)
            .await
            .map_err(|e| ToolError::file_call("read", &args.path, user, &sandbox.id, e))?;
        let size = part.size;
        let window = part.data;
        let start = (lead as usize).min(window.len());
        let mut end = window.len().min(start + wanted as usize);
        loop {
            let result = self.read_page(&args, &sandbox.id, &window, (start, end), offset, size)?;
            let cost = result_size::encoded_size(&result);
            if cost <= MAX_RESULT_BYTES || end == start {
                return Ok(result);
            }
            // Over the bound (escape-heavy text): keep what fits, with a margin for the masks.
            let budget = MAX_RESULT_BYTES.saturating_sub(cost - result_size::cost(&result.content)).saturating_sub(64);
            let fitting = match result.encoding {
                Encoding::Text => result_size::clip(&String::from_utf8_lossy(&window[start..end]), budget).0.len(),
                Encoding::Base64 => budget / 2 / 4 * 3,
            };
            end = start + fitting.min(end - start - 1);
        }
    }

    /// One page of a file: `window[page.0..page.1]` holds bytes from `offset`; the window's bytes around
    /// the page are context for masking.
    fn read_page(
        &self,
        args: &ReadFileArgs,
        sandbox_id: &str,
        window: &Bytes,
        page: (usize, usize),
        offset: u64,
        size: u64,
    ) -> Result<ReadFileResult, ToolError> {
        let (start, mut end) = page;
        let mut data = window.slice(start..end);
        let truncated = offset + (data.len() as u64) < size;
        // Auto encoding: a part cut inside a UTF-8 character ends before it (the next part starts there).
        if truncated
            && args.encoding.is_none()
            && let Err(err) = std::str::from_utf8(&data)
            && err.error_len().is_none()
            && err.valid_up_to() > 0
        {
            data = data.slice(..err.valid_up_to());
            end = start + data.len();
        }
        let returned = data.len() as u64;
        let masked = !self.core.masker.values().is_empty();
        let (encoding, content) = match (args.encoding, std::str::from_utf8(&data)) {
            // Base64 carries the same bytes as text would: masked, a secret cut by a page edge too.
            (Some(Encoding::Base64), _) | (None, Err(_)) if masked => {
                (Encoding::Base64, BASE64.encode(self.core.masker.mask_range(window, start, end)))
            }
            (Some(Encoding::Base64), _) | (None, Err(_)) => (Encoding::Base64, BASE64.encode(&data)),
            (Some(Encoding::Text), Err(_)) => {
                return Err(ToolError::invalid(format!(
                    "{} is not valid UTF-8 text; read it with encoding \"base64\"",
                    args.path
                )));
            }
            (_, Ok(text)) if !masked => (Encoding::Text, text.to_string()),
            (_, Ok(_)) => {
                let masked = self.core.masker.mask_range(window, start, end);
                (Encoding::Text, String::from_utf8_lossy(&masked).into_owned())
            }
        };
        let next_offset = truncated.then_some(offset + returned);
        Ok(ReadFileResult {
            sandbox_id: sandbox_id.to_string(),
            path: args.path.clone(),
            encoding,
            content,
            size,
            offset,
            length: returned,
            truncated,
            next_offset,
        })
    }

    async fn write_file_impl(&self, call: &CallContext, args: WriteFileArgs) -> Result<WriteFileResult, ToolError> {
        validate_path("path", &args.path)?;
        let data = match args.encoding.unwrap_or(Encoding::Text) {
            Encoding::Text => Bytes::from(args.content.into_bytes()),
            Encoding::Base64 => Bytes::from(BASE64.decode(args.content.trim()).map_err(|e| {
                ToolError::invalid(format!(
                    "content is not valid base64 ({e}); send standard base64 or use encoding \"text\""
                ))
            })?),
        };
        if data.len() as u64 > MAX_FILE_BYTES {
            return Err(ToolError::invalid(format!("content is {} bytes; the limit is {MAX_FILE_BYTES}", data.len())));
        }
        let sandbox = self.resolve_sandbox(call, args.sandbox_id.as_deref()).await?;
        self.renew_on_use(&sandbox.id);
        let size = data.len() as u64;
        let user = args.user.unwrap_or_default().name();
        let options = CallOptions::user(user);
        let written = sandbox
            .envd
            .write_file(&args.path, data, &options)
            .await
            .map_err(|e| ToolError::file_call("write", &args.path, user, &sandbox.id, e))?;
        Ok(WriteFileResult { sandbox_id: sandbox.id, path: written.path, bytes_written: size })
    }

    async fn list_files_impl(&self, call: &CallContext, args: ListFilesArgs) -> Result<ListFilesResult, ToolError> {
        let path = args.path.unwrap_or_else(|| "/home/user".to_string());
        validate_path("path", &path)?;
        let depth = args.depth.unwrap_or(1);
        validate_range("depth", u64::from(depth), 1, u64::from(MAX_LIST_DEPTH))?;
        let sandbox = self.resolve_sandbox(call, args.sandbox_id.as_deref()).await?;
        self.renew_on_use(&sandbox.id);
        let user = args.user.unwrap_or_default().name();
        let options = CallOptions::user(user);
        let mut entries = match sandbox.envd.list_dir_capped(&path, depth, MAX_LIST_RESPONSE_BYTES, &options).await {
            Ok(entries) => entries,
            Err(E2bError::TooLarge { .. }) => return Err(ToolError::ListingTooLarge { path, depth }),
            Err(e) => return Err(ToolError::file_call("list", &path, user, &sandbox.id, e)),
        };
        let truncated = entries.len() > MAX_LIST_ENTRIES;
        entries.truncate(MAX_LIST_ENTRIES);
        let entries = entries
            .into_iter()
            .map(|e| FileEntry {
                kind: match e.file_type.as_str() {
                    wire::FILE_TYPE_FILE => "file",
                    wire::FILE_TYPE_DIRECTORY => "dir",
                    wire::FILE_TYPE_SYMLINK => "symlink",
                    _ if e.is_symlink => "symlink",
                    _ => "other",
                }
                .to_string(),
                name: e.name,
                path: e.path,
                size: e.size,
                permissions: e.permissions,
                modified_time: e.modified_time,
                symlink_target: e.symlink_target,
            })
            .collect();
        let mut result = ListFilesResult { sandbox_id: sandbox.id, path, entries, truncated };
        result.truncated |= result_size::fit_list(&mut result, |r| &mut r.entries);
        Ok(result)
    }
}
