//! Images the OCI tests make themselves: a Debian root filesystem from
//! `mmdebstrap` (cached under target/oci-test-cache) and an OCI image layout
//! of it plus a second layer.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code fails loudly
#![allow(dead_code)] // each test binary uses a part of it

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::json;
use sha2::{Digest, Sha256};

/// A Debian bookworm root filesystem tar (`mmdebstrap --variant=apt`), built once per checkout.
pub fn debian_rootfs() -> Option<PathBuf> {
    debian_rootfs_with("debian-bookworm", &[])
}

/// The same with python3 (`--include=python3`: 3.11), built once per checkout.
pub fn debian_python_rootfs() -> Option<PathBuf> {
    debian_rootfs_with("debian-bookworm-python3", &["--include=python3"])
}

fn debian_rootfs_with(name: &str, extra: &[&str]) -> Option<PathBuf> {
    // Tests of one binary run on several threads of one process: one builds, the others wait and
    // then find the tar (they would otherwise write the same `.tar.<pid>` at once).
    static BUILDING: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _one_at_a_time = BUILDING.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let cache = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/oci-test-cache");
    let tar = cache.join(format!("{name}.tar"));
    if tar.is_file() {
        return Some(tar);
    }
    std::fs::create_dir_all(&cache).unwrap();
    let tmp = cache.join(format!("{name}.tar.{}", std::process::id()));
    let status = Command::new("mmdebstrap")
        .args(["--variant=apt", "--mode=root", "--format=tar", "--quiet"])
        .args(extra)
        // The mirror's Release files may look expired to a host clock that is ahead.
        .arg("--aptopt=Acquire::Check-Valid-Until \"false\"")
        .arg("bookworm")
        .arg(&tmp)
        .arg("http://deb.debian.org/debian")
        .status();
    match status {
        Ok(s) if s.success() => {
            std::fs::rename(&tmp, &tar).unwrap();
            Some(tar)
        }
        other => {
            let _ = std::fs::remove_file(&tmp);
            crate::common::gate::skip(&format!(
                "mmdebstrap (apt-get install mmdebstrap) and the Debian mirror are needed for OCI template tests: {other:?}"
            ));
            None
        }
    }
}

fn sha256(bytes: &[u8]) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(bytes)))
}

/// Writes an OCI image layout of `layers` (uncompressed tars; the first gzip-compressed, the
/// others zstd-compressed with the `zstd` tool) into `dir`.
pub fn write_layout(dir: &Path, layers: &[Vec<u8>]) {
    let blobs = dir.join("blobs/sha256");
    std::fs::create_dir_all(&blobs).unwrap();
    let put = |bytes: &[u8]| {
        let d = sha256(bytes);
        std::fs::write(blobs.join(&d[7..]), bytes).unwrap();
        (d, bytes.len())
    };
    let (mut descs, mut diff_ids) = (Vec::new(), Vec::new());
    for (i, layer) in layers.iter().enumerate() {
        let (blob, media) = if i == 0 {
            let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
            gz.write_all(layer).unwrap();
            (gz.finish().unwrap(), "application/vnd.oci.image.layer.v1.tar+gzip")
        } else {
            let mut child = Command::new("zstd")
                .args(["-q", "-c", "-"])
                .stdin(std::process::Stdio::piped())
                .stdout(std::process::Stdio::piped())
                .spawn()
                .expect("zstd (apt-get install zstd)");
            child.stdin.take().unwrap().write_all(layer).unwrap();
            let out = child.wait_with_output().unwrap();
            assert!(out.status.success());
            (out.stdout, "application/vnd.oci.image.layer.v1.tar+zstd")
        };
        let (d, size) = put(&blob);
        diff_ids.push(sha256(layer));
        descs.push(json!({"mediaType": media, "digest": d, "size": size}));
    }
    let config = serde_json::to_vec(&json!({"architecture": "amd64", "os": "linux",
        "config": {"Env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"], "Cmd": ["bash"]},
        "rootfs": {"type": "layers", "diff_ids": diff_ids}}))
    .unwrap();
    let (cd, csize) = put(&config);
    let manifest =
        serde_json::to_vec(&json!({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": cd, "size": csize},
        "layers": descs}))
        .unwrap();
    let (md, msize) = put(&manifest);
    let index = json!({"schemaVersion": 2, "manifests": [{"mediaType": "application/vnd.oci.image.manifest.v1+json",
        "digest": md, "size": msize, "platform": {"architecture": "amd64", "os": "linux"}}]});
    std::fs::write(dir.join("index.json"), serde_json::to_vec(&index).unwrap()).unwrap();
    std::fs::write(dir.join("oci-layout"), r#"{"imageLayoutVersion":"1.0.0"}"#).unwrap();
}

/// A layer tar of regular files (`path`, bytes), owned by root, mode 0644.
pub fn file_layer(files: &[(&str, &[u8])]) -> Vec<u8> {
    let files: Vec<(&str, &[u8], u32)> = files.iter().map(|&(path, data)| (path, data, 0o644)).collect();
    moded_file_layer(&files)
}

/// A layer tar of regular files (`path`, bytes, mode), owned by root.
pub fn moded_file_layer(files: &[(&str, &[u8], u32)]) -> Vec<u8> {
    let mut builder = tar::Builder::new(Vec::new());
    for &(path, data, mode) in files {
        let mut header = tar::Header::new_gnu();
        header.set_size(data.len() as u64);
        header.set_mode(mode);
        header.set_uid(0);
        header.set_gid(0);
        header.set_mtime(0);
        header.set_cksum();
        builder.append_data(&mut header, path, data).unwrap();
    }
    builder.into_inner().unwrap()
}

/// `bytes` gzipped (fast level), as a layer blob.
pub fn gzip(bytes: &[u8]) -> Vec<u8> {
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    gz.write_all(bytes).unwrap();
    gz.finish().unwrap()
}

/// The second layer: removes /etc/motd (a whiteout), empties /var/cache/apt (opaque), adds a file.
pub fn second_layer() -> Vec<u8> {
    file_layer(&[
        ("etc/.wh.motd", b""),
        ("var/cache/apt/.wh..wh..opq", b""),
        ("opt/layer2/hello", b"from the second layer\n"),
    ])
}

/// A layer of whiteouts removing `paths` (relative, e.g. `usr/bin/python3`).
pub fn whiteout_layer(paths: &[&str]) -> Vec<u8> {
    let mut builder = tar::Builder::new(Vec::new());
    for path in paths {
        let (dir, name) = path.rsplit_once('/').unwrap_or(("", path));
        let mut header = tar::Header::new_gnu();
        header.set_size(0);
        header.set_mode(0o644);
        header.set_uid(0);
        header.set_gid(0);
        header.set_mtime(0);
        header.set_cksum();
        let entry = if dir.is_empty() { format!(".wh.{name}") } else { format!("{dir}/.wh.{name}") };
        builder.append_data(&mut header, entry, &b""[..]).unwrap();
    }
    builder.into_inner().unwrap()
}

/// The manifest digest an OCI layout's index.json names.
pub fn manifest_digest(dir: &Path) -> String {
    let index: serde_json::Value = serde_json::from_slice(&std::fs::read(dir.join("index.json")).unwrap()).unwrap();
    index["manifests"][0]["digest"].as_str().unwrap().to_owned()
}
