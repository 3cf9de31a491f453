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
#[path = "oci_support/image.rs"]
mod oci;

use std::path::Path;
use std::process::Command;

use harness::*;
use oci::*;
use serde_json::json;

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

    // A SIGKILL in the middle of an import leaves no layer and no record; the next command clears tmp/.
    let mut killed = Command::new(common::binary())
        .arg("template")
        .arg("--state-dir")
        .arg(&p.state)
        .args(["import", "deb", src.path().to_str().unwrap()])
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    assert!(wait_until(std::time::Duration::from_secs(20), || std::fs::read_dir(p.state.join("store/tmp"))
        .is_ok_and(|mut d| d.next().is_some())));
    std::thread::sleep(std::time::Duration::from_millis(500));
    killed.kill().unwrap();
    killed.wait().unwrap();
    assert_eq!(std::fs::read_dir(p.state.join("store/layers")).unwrap().count(), 0, "no half layer");
    assert!(template_cmd(&p.state, &["list"]).status.success());
    assert_eq!(std::fs::read_dir(p.state.join("store/tmp")).unwrap().count(), 0, "leftovers removed");
    assert!(!p.state.join("store/templates/deb.json").exists());

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

    // E2B's GET /templates: base and both stored templates; this image (--variant=apt) has no python3.
    let (status, list) = p.call(reqwest::Method::GET, "/templates", None).await;
    assert_eq!(status, reqwest::StatusCode::OK, "{list}");
    let find = |name: &str| list.as_array().unwrap().iter().find(|t| t["names"][0] == name).cloned().unwrap();
    let deb = find("deb");
    assert_eq!(
        (deb["kind"].as_str(), deb["buildStatus"].as_str(), deb.get("python3")),
        (Some("stored"), Some("ready"), None)
    );
    assert!(deb["templateID"].as_str().unwrap().len() == 20 && deb["sizeBytes"].as_u64().unwrap() > 0, "{deb}");
    assert_eq!(deb["aliases"], json!(["deb"]));
    assert_eq!(find("deb2")["sizeBytes"], deb["sizeBytes"], "the same layers");
    assert!(find("base")["python3"].as_str().unwrap().starts_with("3."), "{list}");

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
