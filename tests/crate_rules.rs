//! Rules of the source tree that the compiler does not check by itself: every
//! file says what it owns, `unsafe` lives only in the modules allowed to use it
//! and every use carries a `SAFETY:` comment, and the declared minimum Rust
//! version is the one the README states. No root, no processes: runs in
//! milliseconds.

use std::path::{Path, PathBuf};

/// Files allowed to hold `unsafe` (each module is `#[allow(unsafe_code)]` by name;
/// the crate denies it everywhere else).
const UNSAFE_ALLOWED: &[&str] = &[
    "src/local/agent_process.rs",
    "src/local/agent_spawn.rs",
    "src/local/disk.rs",
    "src/local/fds.rs",
    "src/local/mod.rs",
    "src/local/sandbox_init.rs",
    "src/local/state_lock.rs",
    "src/local/userns.rs",
    "src/local/envd/fsops.rs",
    "src/local/envd/reaper.rs",
    "src/local/envd/spawn.rs",
    "src/local/envd/staged.rs",
    "src/local/envd/xattrs.rs",
    "src/local/net/netns.rs",
    "src/local/net/tcp_egress.rs",
    "src/local/net/udp.rs",
];

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("source directory is readable").flatten() {
        let path = entry.path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

fn sources() -> Vec<(String, String)> {
    let mut files = Vec::new();
    rust_files(&root().join("src"), &mut files);
    files.sort();
    assert!(files.len() > 50, "found only {} source files under src/", files.len());
    files
        .into_iter()
        .map(|path| {
            let relative = path.strip_prefix(root()).expect("under the root").to_string_lossy().into_owned();
            (relative, std::fs::read_to_string(&path).expect("source file is UTF-8"))
        })
        .collect()
}

/// Lines of code that use `unsafe` (comments and lint attributes are not uses).
fn unsafe_uses(text: &str) -> Vec<(usize, &str)> {
    text.lines()
        .enumerate()
        .filter(|(_, line)| {
            let code = line.split("//").next().unwrap_or("");
            code.contains("unsafe {") || code.contains("unsafe fn") || code.contains("unsafe impl")
        })
        .collect()
}

#[test]
fn every_source_file_opens_with_a_module_doc() {
    let missing: Vec<String> =
        sources().into_iter().filter(|(_, text)| !text.starts_with("//!")).map(|(path, _)| path).collect();
    assert!(missing.is_empty(), "these files do not start with a `//!` comment saying what they own: {missing:?}");
}

#[test]
fn unsafe_lives_only_in_allowed_modules_and_says_why() {
    let mut outside = Vec::new();
    let mut unexplained = Vec::new();
    for (path, text) in sources() {
        let lines: Vec<&str> = text.lines().collect();
        for (index, _) in unsafe_uses(&text) {
            if !UNSAFE_ALLOWED.contains(&path.as_str()) {
                outside.push(format!("{path}:{}", index + 1));
            }
            // The SAFETY comment sits on the line itself or in the comment block just above it.
            let explained = (index.saturating_sub(4)..=index).any(|i| lines[i].contains("SAFETY"));
            if !explained {
                unexplained.push(format!("{path}:{}", index + 1));
            }
        }
    }
    assert!(outside.is_empty(), "`unsafe` outside the allowed modules: {outside:?}");
    assert!(unexplained.is_empty(), "`unsafe` without a `SAFETY:` comment: {unexplained:?}");
}

#[test]
fn the_allow_list_names_real_files_that_need_it() {
    let sources = sources();
    for allowed in UNSAFE_ALLOWED {
        let (_, text) = sources
            .iter()
            .find(|(path, _)| path == allowed)
            .unwrap_or_else(|| panic!("{allowed} is in the unsafe allow-list but does not exist"));
        assert!(!unsafe_uses(text).is_empty(), "{allowed} no longer uses `unsafe`: take it off the allow-list");
    }
}

#[test]
fn declared_minimum_rust_is_the_one_the_readme_states() {
    let manifest = std::fs::read_to_string(root().join("Cargo.toml")).expect("Cargo.toml");
    let declared = manifest
        .lines()
        .find_map(|line| line.strip_prefix("rust-version = "))
        .map(|v| v.trim_matches('"').to_owned())
        .expect("Cargo.toml declares rust-version");
    let readme = std::fs::read_to_string(root().join("README.md")).expect("README.md");
    assert!(
        readme.contains(&format!("Rust {declared} or newer")),
        "README.md must state the minimum Rust version declared in Cargo.toml ({declared})"
    );
    // Let chains (stable in 1.88) are used throughout; an older declaration would be a lie
    // (clippy's `incompatible_msrv`, run with -D warnings in CI, checks std APIs against it).
    let minor: u32 = declared.split('.').nth(1).and_then(|m| m.parse().ok()).expect("rust-version is 1.N");
    assert!(minor >= 88, "rust-version {declared} is older than the let chains the code uses (1.88)");
}
