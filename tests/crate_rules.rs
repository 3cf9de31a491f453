//! Rules of the source tree that the compiler does not check by itself: every
//! file says what it owns, `unsafe` lives only in the modules allowed to use it
//! (that every use says why is clippy's `undocumented_unsafe_blocks`, denied in
//! Cargo.toml's `[lints]`), the modules of a directory
//! import each other without cycles, and the declared minimum Rust version is
//! the one the README states. No root, no processes: runs in
//! milliseconds.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code fails loudly

use std::path::{Path, PathBuf};

/// Files allowed to hold `unsafe` (each module is `#[allow(unsafe_code)]` by name;
/// the crate denies it everywhere else).
const UNSAFE_ALLOWED: &[&str] = &[
    "src/local/control/agent_process.rs",
    "src/local/control/state_lock.rs",
    "src/local/envd/files/fsops.rs",
    "src/local/envd/files/staged.rs",
    "src/local/envd/files/xattrs.rs",
    "src/local/envd/process/clone_exec.rs",
    "src/local/envd/process/reaper.rs",
    "src/local/envd/process/spawn.rs",
    "src/local/fds.rs",
    "src/local/isolation/agent_spawn.rs",
    "src/local/isolation/disk.rs",
    "src/local/isolation/sandbox_init.rs",
    "src/local/isolation/userns.rs",
    "src/local/mod.rs",
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
fn unsafe_lives_only_in_allowed_modules() {
    let mut outside = Vec::new();
    for (path, text) in sources() {
        for (index, _) in unsafe_uses(&text) {
            if !UNSAFE_ALLOWED.contains(&path.as_str()) {
                outside.push(format!("{path}:{}", index + 1));
            }
        }
    }
    assert!(outside.is_empty(), "`unsafe` outside the allowed modules: {outside:?}");
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

/// The sibling modules of `dir` that each of its modules names (`super::m`, `super::super::m` from a file
/// in a module's own directory, ..., or `crate::<dir path>::m`), by module name.
fn sibling_imports(dir: &str) -> std::collections::BTreeMap<String, std::collections::BTreeSet<String>> {
    let dir_path = root().join(dir);
    let mut modules = std::collections::BTreeMap::new();
    for entry in std::fs::read_dir(&dir_path).expect("module directory is readable").flatten() {
        let path = entry.path();
        let name = path.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
        let mut files = Vec::new();
        if path.is_dir() {
            rust_files(&path, &mut files);
        } else if path.extension().is_some_and(|e| e == "rs") && name != "mod" {
            files.push(path);
        }
        if !files.is_empty() {
            modules.insert(name, files);
        }
    }
    let crate_path = format!("crate::{}::", dir.trim_start_matches("src/").replace('/', "::"));
    let mut graph = std::collections::BTreeMap::new();
    for (name, files) in &modules {
        let mut named = std::collections::BTreeSet::new();
        for file in files {
            let text = std::fs::read_to_string(file).expect("source file is UTF-8");
            let code: String = text.lines().map(|l| l.split("//").next().unwrap_or("")).collect::<Vec<_>>().join("\n");
            // How far up `dir` is: one `super` per directory level (a `mod.rs` is its directory's module).
            let relative = file.strip_prefix(&dir_path).expect("under the directory");
            let levels = relative.components().count() - usize::from(relative.ends_with("mod.rs"));
            let prefix = "super::".repeat(levels);
            for pattern in [prefix.as_str(), crate_path.as_str()] {
                for (at, _) in code.match_indices(pattern) {
                    // `super::x` inside `super::super::x` names another module.
                    if code[..at].ends_with("super::") {
                        continue;
                    }
                    let rest = &code[at + pattern.len()..];
                    let heads: Vec<&str> = match rest.strip_prefix('{') {
                        // A group: the first name of each top-level item.
                        Some(group) => {
                            let (mut depth, mut items, mut start) = (0, Vec::new(), 0);
                            for (i, c) in group.char_indices() {
                                match c {
                                    '{' => depth += 1,
                                    '}' if depth == 0 => {
                                        items.push(&group[start..i]);
                                        break;
                                    }
                                    '}' => depth -= 1,
                                    ',' if depth == 0 => {
                                        items.push(&group[start..i]);
                                        start = i + 1;
                                    }
                                    _ => {}
                                }
                            }
                            items
                        }
                        None => vec![rest],
                    };
                    for head in heads {
                        let ident: String =
                            head.trim_start().chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
                        if ident != *name && modules.contains_key(&ident) {
                            named.insert(ident);
                        }
                    }
                }
            }
        }
        graph.insert(name.clone(), named);
    }
    graph
}

/// A cycle of `graph` (the module names along it), if any.
fn find_cycle(graph: &std::collections::BTreeMap<String, std::collections::BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit<'a>(
        node: &'a str,
        graph: &'a std::collections::BTreeMap<String, std::collections::BTreeSet<String>>,
        path: &mut Vec<&'a str>,
        done: &mut std::collections::BTreeSet<&'a str>,
    ) -> Option<Vec<String>> {
        if let Some(at) = path.iter().position(|n| *n == node) {
            return Some(path[at..].iter().chain([&node]).map(|n| n.to_string()).collect());
        }
        if !done.insert(node) {
            return None;
        }
        path.push(node);
        for next in graph.get(node).into_iter().flatten() {
            if let Some(cycle) = visit(next, graph, path, done) {
                return Some(cycle);
            }
        }
        path.pop();
        None
    }
    let mut done = std::collections::BTreeSet::new();
    graph.keys().find_map(|node| visit(node, graph, &mut Vec::new(), &mut done))
}

/// Every module directory below src/ (src/gateway, src/local/envd, ...).
fn module_directories() -> Vec<String> {
    fn walk(dir: &Path, out: &mut Vec<String>) {
        for entry in std::fs::read_dir(dir).expect("source directory is readable").flatten() {
            if entry.path().is_dir() {
                out.push(entry.path().strip_prefix(root()).expect("under the root").to_string_lossy().into_owned());
                walk(&entry.path(), out);
            }
        }
    }
    let mut dirs = Vec::new();
    walk(&root().join("src"), &mut dirs);
    dirs.sort();
    dirs
}

#[test]
fn sibling_modules_import_each_other_without_cycles() {
    let gateway = sibling_imports("src/gateway");
    assert!(gateway.len() > 6, "found only {} modules in src/gateway", gateway.len());
    assert!(gateway["server"].contains("http"), "the scan must see `use super::http::...`: {gateway:?}");
    assert!(gateway["oauth"].is_empty() && gateway["mcp"].contains("tools"), "{gateway:?}");
    let mcp = sibling_imports("src/gateway/mcp");
    assert!(mcp["mcp_tasks"].contains("mcp_task_id"), "{mcp:?}");
    let dirs = module_directories();
    assert!(dirs.contains(&"src/local/envd".to_string()), "{dirs:?}");
    for dir in dirs {
        if let Some(cycle) = find_cycle(&sibling_imports(&dir)) {
            panic!(
                "the modules of {dir} import each other in a cycle: {}; move what both need to a module lower \
                 down (in src/gateway: limits to tools/args.rs, the Gateway type to state/)",
                cycle.join(" -> ")
            );
        }
    }
}
