//! OCI templates end to end: a real Debian root filesystem (`mmdebstrap`,
//! cached under target/oci-test-cache) packed by the test as an OCI image
//! layout with a second layer (a whiteout, a new file), imported with the real
//! `sandbox-mcp template import`, and a sandbox created from it through the
//! provider's API: the image's own userland (`dpkg`, `apt-get`) works inside,
//! the host's files are not there, and `template rm`/`gc` free the layers
//! once no sandbox uses them. Needs root (skips loudly otherwise).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code fails loudly

mod common;
#[path = "local_provider_support/harness.rs"]
mod harness;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;

use harness::*;
use serde_json::json;
use sha2::{Digest, Sha256};

/// A Debian bookworm root filesystem tar (`mmdebstrap --variant=apt`), built once per checkout.
pub fn debian_rootfs() -> Option<PathBuf> {
    let cache = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/oci-test-cache");
    let tar = cache.join("debian-bookworm.tar");
    if tar.is_file() {
        return Some(tar);
    }
    std::fs::create_dir_all(&cache).unwrap();
    let tmp = cache.join(format!("debian-bookworm.tar.{}", std::process::id()));
    let status = Command::new("mmdebstrap")
        .args(["--variant=apt", "--mode=root", "--format=tar", "--quiet"])
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
            common::gate::skip(&format!(
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

/// The second layer: removes /etc/motd (a whiteout), empties /var/cache/apt (opaque), adds a file.
pub fn second_layer() -> Vec<u8> {
    let mut builder = tar::Builder::new(Vec::new());
    let mut add = |path: &str, data: &[u8]| {
        let mut header = tar::Header::new_gnu();
        header.set_size(data.len() as u64);
        header.set_mode(0o644);
        header.set_uid(0);
        header.set_gid(0);
        header.set_mtime(0);
        header.set_cksum();
        builder.append_data(&mut header, path, data).unwrap();
    };
    add("etc/.wh.motd", b"");
    add("var/cache/apt/.wh..wh..opq", b"");
    add("opt/layer2/hello", b"from the second layer\n");
    builder.into_inner().unwrap()
}

fn template_cmd(state: &Path, args: &[&str]) -> std::process::Output {
    Command::new(common::binary()).arg("template").arg("--state-dir").arg(state).args(args).output().unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn an_imported_debian_image_runs_its_own_userland_and_gc_frees_it_after_use() {
    require_root!();
    let Some(rootfs) = debian_rootfs() else { return };
    let src = tempfile::tempdir_in(Path::new(env!("CARGO_MANIFEST_DIR")).join("target")).unwrap();
    let started = std::time::Instant::now();
    write_layout(src.path(), &[std::fs::read(&rootfs).unwrap(), second_layer()]);
    eprintln!("packed the OCI layout in {:?}", started.elapsed());
    let p = Provider::start(&[]);

    let started = std::time::Instant::now();
    let out = template_cmd(&p.state, &["import", "deb", src.path().to_str().unwrap()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    eprintln!("imported in {:?}: {}", started.elapsed(), String::from_utf8_lossy(&out.stdout));
    // The same image again (as a tar of the layout) shares both layers.
    let layout_tar = src.path().with_extension("tar");
    {
        let mut builder = tar::Builder::new(std::fs::File::create(&layout_tar).unwrap());
        builder.append_dir_all(".", src.path()).unwrap();
        builder.finish().unwrap();
    }
    let out = template_cmd(&p.state, &["import", "deb2", layout_tar.to_str().unwrap()]);
    let _ = std::fs::remove_file(&layout_tar);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(std::fs::read_dir(p.state.join("store/layers")).unwrap().count(), 2, "layers are stored once");
    let list = String::from_utf8(template_cmd(&p.state, &["list"]).stdout).unwrap();
    assert!(list.contains("deb ") && list.contains("deb2"), "{list}");

    let sbx = p.create(json!({"templateID": "deb", "timeout": 120})).await;
    let (code, out) = p.run(&sbx, "dpkg -l | grep -c '^ii'", None).await;
    assert_eq!(code, 0, "{out}");
    assert!(out.trim().parse::<u32>().unwrap() > 50, "the image's package database: {out}");
    let (code, out) = p.run(&sbx, "apt-get --version | head -1; . /etc/os-release; echo $VERSION_CODENAME", None).await;
    assert_eq!(code, 0, "{out}");
    assert!(out.starts_with("apt ") && out.contains("bookworm"), "{out}");
    let (code, out) = p
        .run(&sbx, "cat /opt/layer2/hello; test ! -e /etc/motd && echo motd-hidden; ls -A /var/cache/apt | wc -l", None)
        .await;
    assert_eq!((code, out.as_str()), (0, "from the second layer\nmotd-hidden\n0\n"));
    // Nothing of the host: its own programs and its worktree are not in the image.
    let host_only = common::binary();
    let (code, out) = p
        .run(&sbx, &format!("test ! -e /usr/bin/mmdebstrap && test ! -e {} && echo clean", host_only.display()), None)
        .await;
    assert_eq!((code, out.trim()), (0, "clean"));
    // The sandbox writes to its own layer; the stored layers stay as they were.
    let (code, _) = p.run(&sbx, "echo changed > /opt/layer2/hello && rm /usr/bin/apt-get", Some("root")).await;
    assert_eq!(code, 0);
    let sbx2 = p.create(json!({"templateID": "deb2", "timeout": 60})).await;
    let (code, out) = p.run(&sbx2, "cat /opt/layer2/hello && test -x /usr/bin/apt-get && echo apt", None).await;
    assert_eq!((code, out.as_str()), (0, "from the second layer\napt\n"));

    // rm + gc while a sandbox uses the layers: they stay.
    assert!(template_cmd(&p.state, &["rm", "deb"]).status.success());
    assert!(template_cmd(&p.state, &["rm", "deb2"]).status.success());
    let out = template_cmd(&p.state, &["rm", "deb"]);
    assert!(!out.status.success() && String::from_utf8_lossy(&out.stderr).contains("template list"));
    assert!(template_cmd(&p.state, &["gc"]).status.success());
    assert_eq!(std::fs::read_dir(p.state.join("store/layers")).unwrap().count(), 2, "in use by sandboxes");
    let (status, _) = p.call(reqwest::Method::POST, "/sandboxes", Some(json!({"templateID": "deb"}))).await;
    assert_eq!(status, reqwest::StatusCode::NOT_FOUND);
    for s in [&sbx, &sbx2] {
        let (status, _) = p.call(reqwest::Method::DELETE, &format!("/sandboxes/{}", id_of(s)), None).await;
        assert_eq!(status, reqwest::StatusCode::NO_CONTENT);
    }
    wait_until(std::time::Duration::from_secs(20), || {
        template_cmd(&p.state, &["gc"]);
        std::fs::read_dir(p.state.join("store/layers")).unwrap().count() == 0
    });
}
