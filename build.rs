//! Build settings for the binaries.
//!
//! - `-z pack-relative-relocs` (DT_RELR, glibc >= 2.36, binutils >= 2.38) shrinks the
//!   position-independent binaries' relocation tables from hundreds of KiB to a few KiB. The
//!   dynamic loader reads the whole table at every start, so each sandbox's envd (one process
//!   per sandbox) would keep those pages resident. Set `SANDBOX_MCP_NO_RELR=1` to build for an
//!   older glibc.
//! - `SANDBOX_MCP_BUILD_ID`: a hash of the sources, so that `sandbox-mcp` uses the lean
//!   `sandbox-mcp-envd` beside it only when both come from the same sources (see
//!   `local::control::agent_binary`).

use std::hash::{Hash, Hasher};
use std::path::Path;

fn main() {
    println!("cargo:rerun-if-env-changed=SANDBOX_MCP_NO_RELR");
    let target_os = std::env::var("CARGO_CFG_TARGET_OS").unwrap_or_default();
    let target_env = std::env::var("CARGO_CFG_TARGET_ENV").unwrap_or_default();
    if target_os == "linux" && target_env == "gnu" && std::env::var_os("SANDBOX_MCP_NO_RELR").is_none() {
        println!("cargo:rustc-link-arg-bins=-Wl,-z,pack-relative-relocs");
    }

    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    for input in ["Cargo.toml", "Cargo.lock", "build.rs", "src", "supervisor"] {
        println!("cargo:rerun-if-changed={input}");
        hash_tree(Path::new(input), &mut hasher);
    }
    for var in ["PROFILE", "TARGET", "OPT_LEVEL", "DEBUG"] {
        std::env::var(var).unwrap_or_default().hash(&mut hasher);
    }
    println!("cargo:rustc-env=SANDBOX_MCP_BUILD_ID={:016x}", hasher.finish());
}

/// Hashes every file under `path` (names and contents, in sorted order).
fn hash_tree(path: &Path, hasher: &mut impl Hasher) {
    if path.is_dir() {
        let mut entries: Vec<_> = match std::fs::read_dir(path) {
            Ok(dir) => dir.flatten().map(|e| e.path()).collect(),
            Err(_) => return,
        };
        entries.sort();
        for entry in entries {
            hash_tree(&entry, hasher);
        }
    } else if let Ok(bytes) = std::fs::read(path) {
        path.hash(hasher);
        bytes.hash(hasher);
    }
}
