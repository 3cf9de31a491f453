//! The agent's files: the `/files` HTTP API (`http`: downloads with byte
//! ranges, uploads, and the plain-HTTP JSON errors), what a `/files` request
//! negotiates (`negotiation`: ranges, gzip), uploads staged aside and put in
//! place when complete (`staged`), the `filesystem.Filesystem` Connect RPCs
//! (`fs_rpc`), the operations they share, run with the requesting user's
//! filesystem identity (`fsops`), and `user.e2b.*` metadata (`xattrs`).

pub(super) mod fs_rpc;
#[allow(unsafe_code)] // system calls; every block has a SAFETY comment
pub(super) mod fsops;
pub(super) mod http;
mod negotiation;
#[allow(unsafe_code)] // system calls; every block has a SAFETY comment
mod staged;
#[allow(unsafe_code)] // system calls; every block has a SAFETY comment
mod xattrs;
