//! OCI templates end to end: a real Debian root filesystem (`mmdebstrap`,
//! cached under target/oci-test-cache) packed by the test as an OCI image
//! layout with a second layer (a whiteout, a new file), imported with the real
//! `sandbox-mcp template import`, and a sandbox created from it through the
//! provider's API: the image's own userland (`dpkg`, `apt-get`) works inside,
//! the host's files are not there, and `template rm`/`gc` free the layers
//! once no sandbox uses them. Needs root (skips loudly otherwise).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code fails loudly

use crate::{common, harness, oci};
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
    // Killed once a layer is part-extracted: files under a scratch directory's `fs/` in tmp/.
    let half_layer = || {
        let Ok(scratches) = std::fs::read_dir(p.state.join("store/tmp")) else { return false };
        scratches.flatten().any(|s| std::fs::read_dir(s.path().join("fs")).is_ok_and(|mut d| d.next().is_some()))
    };
    assert!(wait_until(std::time::Duration::from_secs(20), half_layer), "the import never started extracting a layer");
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

/// A layer giving the image its own `/root` and `/home/user` (owned by 1000, as `useradd -m`
/// makes it), a file in `/tmp` (hidden: `/tmp` is private) and a builder's `/etc/hosts` line.
fn home_layer() -> Vec<u8> {
    let mut builder = tar::Builder::new(Vec::new());
    let mut add = |path: &str, data: Option<&[u8]>, mode: u32, owner: u64| {
        let mut header = tar::Header::new_gnu();
        header.set_entry_type(if data.is_some() { tar::EntryType::Regular } else { tar::EntryType::Directory });
        header.set_size(data.map_or(0, |d| d.len() as u64));
        header.set_mode(mode);
        header.set_uid(owner);
        header.set_gid(owner);
        header.set_mtime(0);
        header.set_cksum();
        builder.append_data(&mut header, path, data.unwrap_or_default()).unwrap();
    };
    add("root/", None, 0o700, 0);
    add("root/.image-root", Some(b"root's file\n"), 0o600, 0);
    add("home/user/", None, 0o755, 1000);
    add("home/user/.image-home", Some(b"user's file\n"), 0o644, 1000);
    add("tmp/from-image", Some(b"hidden\n"), 0o644, 0);
    add("etc/hosts", Some(b"127.0.0.1\tlocalhost\n127.0.1.1\tbuilder\n"), 0o644, 0);
    builder.into_inner().unwrap()
}

/// An OCI layout of the Debian image plus `extra` layers, in a temporary directory under target/.
fn debian_layout(extra: Vec<Vec<u8>>) -> Option<tempfile::TempDir> {
    let rootfs = debian_rootfs()?;
    let src = tempfile::tempdir_in(Path::new(env!("CARGO_MANIFEST_DIR")).join("target")).unwrap();
    let mut layers = vec![std::fs::read(&rootfs).unwrap()];
    layers.extend(extra);
    write_layout(src.path(), &layers);
    Some(src)
}

fn import(p: &Provider, name: &str, src: &Path, extra: &[&str]) {
    let mut args = vec!["import", name, src.to_str().unwrap()];
    args.extend_from_slice(extra);
    let out = template_cmd(&p.state, &args);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_stored_template_shows_its_own_home_and_root_and_keeps_tmp_private() {
    require_root!();
    let Some(src) = debian_layout(vec![home_layer()]) else { return };
    let p = Provider::start(&[]);
    import(&p, "homes", src.path(), &[]);
    let sbx = p.create(json!({"templateID": "homes", "timeout": 120})).await;
    let (code, out) = p.run(&sbx, "cat /root/.image-root; echo more > /root/written", Some("root")).await;
    assert_eq!((code, out.as_str()), (0, "root's file\n"));
    let (code, out) = p.run(&sbx, "cat /root/written; stat -c %U:%a /root", Some("root")).await;
    assert_eq!((code, out.as_str()), (0, "more\nroot:700\n"), "writes to /root persist");
    let (code, out) =
        p.run(&sbx, "cat ~/.image-home && echo mine > ~/new && cat ~/new && stat -c %U /home/user", None).await;
    assert_eq!((code, out.as_str()), (0, "user's file\nmine\nuser\n"), "user writes its home");
    let (code, out) = p.run(&sbx, "test ! -e /tmp/from-image && echo private; stat -c %a /tmp", None).await;
    assert_eq!((code, out.as_str()), (0, "private\n1777\n"));
    let (code, out) = p.run(&sbx, "grep 127.0.1.1 /etc/hosts", None).await;
    assert_eq!((code, out), (0, format!("127.0.1.1\t{}\n", id_of(&sbx))), "the builder's line is replaced");
    // The writes landed in the sandbox's own layer, not in the stored one.
    let sbx2 = p.create(json!({"templateID": "homes", "timeout": 60})).await;
    let (code, out) = p.run(&sbx2, "ls -A /root /home/user", Some("root")).await;
    assert_eq!(code, 0);
    assert!(out.contains(".image-root") && out.contains(".image-home"), "{out}");
    assert!(!out.contains("written") && !out.contains("new"), "{out}");

    // A snapshot of the first sandbox stacks on the image's layers: its writes to /root and the
    // home it shares with the image come along, a file it removed from the image stays removed,
    // and the image's own userland still works.
    let (code, out) = p.run(&sbx, "rm /home/user/.image-home && dpkg -l | grep -c '^ii'", Some("root")).await;
    assert_eq!(code, 0, "{out}");
    let (status, snap) = p
        .call(reqwest::Method::POST, &format!("/sandboxes/{}/snapshots", id_of(&sbx)), Some(json!({"memory": false})))
        .await;
    assert_eq!(status, reqwest::StatusCode::CREATED, "{snap}");
    let from_snap = p.create(json!({"templateID": snap["snapshotID"], "timeout": 60})).await;
    let (code, copied) = p
        .run(
            &from_snap,
            "cat /root/written /home/user/new; test -e /home/user/.image-home || echo removed; dpkg -l | grep -c '^ii'",
            Some("root"),
        )
        .await;
    assert_eq!(code, 0, "{copied}");
    assert!(copied.starts_with("more\nmine\nremoved\n"), "{copied}");
    assert!(copied.ends_with(&out), "dpkg sees the same packages: {copied} against {out}");

    // An image without /home/user (plain Debian) gets one owned by `user`.
    let plain = debian_layout(Vec::new()).unwrap();
    import(&p, "plain", plain.path(), &[]);
    let sbx3 = p.create(json!({"templateID": "plain", "timeout": 60})).await;
    let (code, out) = p.run(&sbx3, "stat -c %U:%a /home/user && touch ~/x && pwd", None).await;
    assert_eq!((code, out.as_str()), (0, "user:755\n/home/user\n"));
    let (code, out) = p.run(&sbx3, "ls -A /root | head -3; stat -c %U /root", Some("root")).await;
    assert_eq!(code, 0);
    assert!(out.ends_with("root\n") && out.contains(".bashrc"), "Debian's own /root: {out}");
}

/// Every process's command line in the sandbox (no procps in the image).
const PROCESSES: &str = "for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline; echo; done";

#[tokio::test(flavor = "multi_thread")]
async fn a_templates_start_command_runs_at_create_and_create_waits_for_its_ready_command() {
    require_root!();
    let Some(src) = debian_layout(Vec::new()) else { return };
    let inner = common::Provider::builder()
        .env("SANDBOX_MCP_LOCAL__TEMPLATE_READY_TIMEOUT_SECS", "3")
        .temp_in("/var/tmp")
        .start();
    let p = Provider { state: inner.state_dir.clone(), inner, http: reqwest::Client::new() };
    let start = "sleep 1; (id -un; pwd; echo $GREETING) > /tmp/up.tmp; mv /tmp/up.tmp /tmp/up; exec sleep 600";
    import(&p, "server", src.path(), &["--start-cmd", start, "--ready-cmd", "test -f /tmp/up"]);
    let record: serde_json::Value =
        serde_json::from_slice(&std::fs::read(p.state.join("store/templates/server.json")).unwrap()).unwrap();
    assert_eq!(
        (record["config"]["start_cmd"].as_str(), record["config"]["ready_cmd"].as_str()),
        (Some(start), Some("test -f /tmp/up"))
    );

    let started = std::time::Instant::now();
    let sbx = p.create(json!({"templateID": "server", "timeout": 120})).await;
    let took = started.elapsed();
    let (code, out) = p.run(&sbx, "cat /tmp/up", None).await;
    assert_eq!((code, out.as_str()), (0, "user\n/home/user\n\n"), "ready when create returns (after {took:?})");
    assert!(took >= std::time::Duration::from_secs(1), "create waited for the ready command: {took:?}");
    let (code, out) = p.run(&sbx, &format!("{PROCESSES} | grep -c '^sleep 600'"), None).await;
    assert_eq!((code, out.trim()), (0, "1"), "the start command keeps running after create");

    // A ready command that never succeeds: the create fails within the timeout, naming the
    // template, the command and its last output, and leaves nothing behind.
    let never_start = "echo starting; exec sleep 601.5";
    import(&p, "never", src.path(), &["--start-cmd", never_start, "--ready-cmd", "echo not yet; exit 1"]);
    let started = std::time::Instant::now();
    let (status, body) = p.call(reqwest::Method::POST, "/v2/sandboxes", Some(json!({"templateID": "never"}))).await;
    let took = started.elapsed();
    assert!(status.is_server_error(), "{status} {body}");
    let message = body["message"].as_str().unwrap_or_default();
    for part in
        ["template 'never'", "`echo not yet; exit 1`", "within 3 s", "exited with code 1", "not yet", "starting"]
    {
        assert!(message.contains(part), "{part:?} in {message}");
    }
    assert!(took >= std::time::Duration::from_secs(3) && took < std::time::Duration::from_secs(8), "{took:?}");
    let (_, list) = p.call(reqwest::Method::GET, "/v2/sandboxes", None).await;
    let ids: Vec<String> = list.as_array().unwrap().iter().map(id_of).collect();
    assert_eq!(ids, vec![id_of(&sbx)], "only the ready sandbox is listed");
    let sandboxes = p.state.join("sandboxes");
    assert!(
        wait_until(std::time::Duration::from_secs(10), || std::fs::read_dir(&sandboxes)
            .unwrap()
            .flatten()
            .all(|e| e.file_name().to_str() == Some(id_of(&sbx).as_str()))),
        "the failed sandbox's directory is removed"
    );
    let agents: Vec<String> =
        sandbox_mcp::local::control::agent_process::agents_under(&sandboxes).into_iter().map(|(_, id)| id).collect();
    assert_eq!(agents, vec![id_of(&sbx)], "no agent of the failed sandbox is left");
    // Its start command died with its agent; the ready sandbox lives on.
    let leftover = || {
        let out = std::process::Command::new("pgrep").args(["-f", "-x", "sleep 601.5"]).output().unwrap();
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    };
    assert!(wait_until(std::time::Duration::from_secs(5), || leftover().is_empty()), "left: {}", leftover());
    let (code, out) = p.run(&sbx, "echo alive", None).await;
    assert_eq!((code, out.as_str()), (0, "alive\n"));
}
