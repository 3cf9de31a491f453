//! `filesystem.Filesystem` Connect RPCs (unary): Stat, ListDir, MakeDir,
//! Remove, Move. Each runs as the requesting user (see [`super::fsops`]).
//! WatchDir and the watcher RPCs are not implemented.

use std::sync::Arc;

use axum::body::Body;
use axum::http::HeaderMap;
use axum::response::Response;

use super::fsops::{entry, io_error, list_dir, resolve_path, run_as_user};
use crate::connect_rpc::{Code, ConnectError};
use crate::e2b::wire::{Empty, EntryResponse, ListDirRequest, ListDirResponse, MoveRequest, PathRequest};
use crate::local::envd::EnvdState;
use crate::local::envd::rpc::{self, CallKind};
use crate::local::envd::users::request_user;

/// Dispatches `POST /filesystem.Filesystem/{method}`.
pub async fn handle(state: Arc<EnvdState>, method: String, headers: HeaderMap, body: Body) -> Response {
    match method.as_str() {
        "Stat" | "ListDir" | "MakeDir" | "Remove" | "Move" => {}
        "WatchDir" | "CreateWatcher" | "GetWatcherEvents" | "RemoveWatcher" => {
            return rpc::unimplemented(format!("filesystem.Filesystem/{method} is not supported"));
        }
        _ => return rpc::unimplemented(format!("unknown method filesystem.Filesystem/{method}")),
    }
    rpc::serve(CallKind::Unary, headers, body, |headers, body| async move {
        dispatch(&state, &method, &headers, &body).await
    })
    .await
}

async fn dispatch(state: &EnvdState, method: &str, headers: &HeaderMap, body: &[u8]) -> Result<Response, ConnectError> {
    let user = request_user(headers, &state.opts.default_user)?;
    match method {
        "Stat" => {
            let request: PathRequest = rpc::decode_unary(body)?;
            let path = resolve_path(&user, &request.path)?;
            let entry = run_as_user(&user, move || entry(&path).map_err(|e| io_error(&path, &e))).await??;
            Ok(rpc::unary_ok(&EntryResponse { entry }))
        }
        "ListDir" => {
            let request: ListDirRequest = rpc::decode_unary(body)?;
            let path = resolve_path(&user, &request.path)?;
            let depth = request.depth.max(1);
            let entries = run_as_user(&user, move || {
                let meta = std::fs::metadata(&path).map_err(|e| io_error(&path, &e))?;
                if !meta.is_dir() {
                    return Err(ConnectError::new(
                        Code::InvalidArgument,
                        format!("path '{}' is not a directory", path.display()),
                    ));
                }
                let mut entries = Vec::new();
                list_dir(&path, depth, &mut entries).map_err(|e| io_error(&path, &e))?;
                Ok(entries)
            })
            .await??;
            Ok(rpc::unary_ok(&ListDirResponse { entries }))
        }
        "MakeDir" => {
            let request: PathRequest = rpc::decode_unary(body)?;
            let path = resolve_path(&user, &request.path)?;
            let entry = run_as_user(&user, move || {
                match std::fs::metadata(&path) {
                    Ok(meta) if meta.is_dir() => {
                        return Err(ConnectError::new(
                            Code::AlreadyExists,
                            format!("directory '{}' already exists", path.display()),
                        ));
                    }
                    Ok(_) => {
                        return Err(ConnectError::new(
                            Code::InvalidArgument,
                            format!("path '{}' already exists and is not a directory", path.display()),
                        ));
                    }
                    Err(_) => {}
                }
                std::fs::create_dir_all(&path).map_err(|e| io_error(&path, &e))?;
                entry(&path).map_err(|e| io_error(&path, &e))
            })
            .await??;
            Ok(rpc::unary_ok(&EntryResponse { entry }))
        }
        "Remove" => {
            let request: PathRequest = rpc::decode_unary(body)?;
            let path = resolve_path(&user, &request.path)?;
            if path == std::path::Path::new("/") {
                return Err(ConnectError::new(Code::InvalidArgument, "refusing to remove '/'"));
            }
            run_as_user(&user, move || {
                let meta = std::fs::symlink_metadata(&path).map_err(|e| io_error(&path, &e))?;
                let removed = if meta.is_dir() { std::fs::remove_dir_all(&path) } else { std::fs::remove_file(&path) };
                removed.map_err(|e| io_error(&path, &e))
            })
            .await??;
            Ok(rpc::unary_ok(&Empty {}))
        }
        _ => {
            let request: MoveRequest = rpc::decode_unary(body)?;
            let source = resolve_path(&user, &request.source)?;
            let destination = resolve_path(&user, &request.destination)?;
            let entry = run_as_user(&user, move || {
                std::fs::symlink_metadata(&source).map_err(|e| io_error(&source, &e))?;
                if let Some(parent) = destination.parent() {
                    std::fs::create_dir_all(parent).map_err(|e| io_error(parent, &e))?;
                }
                std::fs::rename(&source, &destination).map_err(|e| io_error(&destination, &e))?;
                entry(&destination).map_err(|e| io_error(&destination, &e))
            })
            .await??;
            Ok(rpc::unary_ok(&EntryResponse { entry }))
        }
    }
}
