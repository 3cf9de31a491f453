//! Link settings for the binaries.
//!
//! `-z pack-relative-relocs` (DT_RELR, glibc >= 2.36, binutils >= 2.38) shrinks the
//! position-independent binary's relocation table from ~580 KiB to a few KiB. The dynamic
//! loader reads that whole table at every start, so each sandbox's envd (one process per
//! sandbox, exec'd from this binary) keeps those pages resident; packed, they are gone.
//! Set `SANDBOX_MCP_NO_RELR=1` to build for an older glibc.

fn main() {
    println!("cargo:rerun-if-env-changed=SANDBOX_MCP_NO_RELR");
    let target_os = std::env::var("CARGO_CFG_TARGET_OS").unwrap_or_default();
    let target_env = std::env::var("CARGO_CFG_TARGET_ENV").unwrap_or_default();
    if target_os == "linux" && target_env == "gnu" && std::env::var_os("SANDBOX_MCP_NO_RELR").is_none() {
        println!("cargo:rustc-link-arg-bins=-Wl,-z,pack-relative-relocs");
    }
}
