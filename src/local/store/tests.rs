//! Unit tests of the store: hostile layers, whiteouts, limits, import, gc.

use std::io::Write;
use std::os::unix::fs::{FileTypeExt, MetadataExt};

use super::extract::{Limits, extract};
use super::*;

/// A tar entry written field by field, so that hostile names (which `tar::Builder` refuses) can be made.
fn entry(out: &mut Vec<u8>, path: &str, kind: tar::EntryType, data: &[u8], link: &str, mode: u32) {
    let mut header = tar::Header::new_ustar();
    {
        let old = header.as_old_mut();
        old.name[..path.len()].copy_from_slice(path.as_bytes());
        old.linkname[..link.len()].copy_from_slice(link.as_bytes());
    }
    header.set_entry_type(kind);
    header.set_size(data.len() as u64);
    header.set_mode(mode);
    header.set_uid(0);
    header.set_gid(0);
    header.set_cksum();
    out.extend_from_slice(header.as_bytes());
    out.extend_from_slice(data);
    out.resize(out.len().div_ceil(512) * 512, 0);
}

fn finish(mut out: Vec<u8>) -> Vec<u8> {
    out.extend_from_slice(&[0u8; 1024]);
    out
}

use tar::EntryType as T;

#[test]
fn traversal_absolute_paths_and_symlinked_parents_stay_inside_the_layer() {
    let outside = tempfile::tempdir().unwrap();
    let layer = tempfile::tempdir().unwrap();
    let escape = outside.path().join("escaped");
    let mut tar = Vec::new();
    entry(&mut tar, &format!("../../../../../../..{}", escape.display()), T::Regular, b"x", "", 0o644);
    let err = extract(&finish(tar)[..], layer.path(), Limits::default()).unwrap_err();
    assert!(matches!(err, StoreError::HostileLayer(_)), "{err}");
    assert!(!escape.exists());

    // An absolute path lands inside the layer.
    let layer = tempfile::tempdir().unwrap();
    let mut tar = Vec::new();
    entry(&mut tar, "/etc/abs", T::Regular, b"inside", "", 0o644);
    extract(&finish(tar)[..], layer.path(), Limits::default()).unwrap();
    assert_eq!(std::fs::read_to_string(layer.path().join("etc/abs")).unwrap(), "inside");

    // A symlink to the host, then a file through it.
    let layer = tempfile::tempdir().unwrap();
    let mut tar = Vec::new();
    entry(&mut tar, "evil", T::Symlink, b"", &outside.path().display().to_string(), 0o777);
    entry(&mut tar, "evil/planted", T::Regular, b"x", "", 0o644);
    let err = extract(&finish(tar)[..], layer.path(), Limits::default()).unwrap_err();
    assert!(matches!(err, StoreError::HostileLayer(_)), "{err}");
    assert!(!outside.path().join("planted").exists());
    // The symlink itself is kept as it is (it resolves inside the sandbox, never here).
    assert_eq!(std::fs::read_link(layer.path().join("evil")).unwrap(), outside.path());
}

#[test]
fn hard_links_only_join_entries_of_the_layer() {
    let host = tempfile::NamedTempFile::new().unwrap();
    let layer = tempfile::tempdir().unwrap();
    let mut tar = Vec::new();
    entry(&mut tar, "hostfile", T::Link, b"", &host.path().display().to_string(), 0o644);
    let err = extract(&finish(tar)[..], layer.path(), Limits::default()).unwrap_err();
    assert!(matches!(err, StoreError::HostileLayer(_)), "{err}");
    assert_eq!(std::fs::metadata(host.path()).unwrap().nlink(), 1, "no link to the host file was made");

    let layer = tempfile::tempdir().unwrap();
    let mut tar = Vec::new();
    entry(&mut tar, "up", T::Link, b"", "../../etc/passwd", 0o644);
    assert!(extract(&finish(tar)[..], layer.path(), Limits::default()).is_err());

    // A link through a symlink to the host is refused too.
    let layer = tempfile::tempdir().unwrap();
    let mut tar = Vec::new();
    entry(&mut tar, "etc", T::Symlink, b"", "/etc", 0o777);
    entry(&mut tar, "pw", T::Link, b"", "etc/passwd", 0o644);
    assert!(extract(&finish(tar)[..], layer.path(), Limits::default()).is_err());

    let layer = tempfile::tempdir().unwrap();
    let mut tar = Vec::new();
    entry(&mut tar, "a", T::Regular, b"same", "", 0o644);
    entry(&mut tar, "b", T::Link, b"", "a", 0o644);
    extract(&finish(tar)[..], layer.path(), Limits::default()).unwrap();
    assert_eq!(std::fs::metadata(layer.path().join("b")).unwrap().nlink(), 2);
}

#[test]
fn devices_are_dropped_and_set_id_bits_need_mapped_ids() {
    let layer = tempfile::tempdir().unwrap();
    let mut tar = Vec::new();
    entry(&mut tar, "dev/sda", T::Block, b"", "", 0o660);
    entry(&mut tar, "bin/su", T::Regular, b"#!", "", 0o4755);
    let mut header = tar::Header::new_ustar();
    header.set_path("bin/foreign").unwrap();
    header.set_size(0);
    header.set_mode(0o6755);
    header.set_uid(200_000);
    header.set_gid(200_000);
    header.set_cksum();
    tar.extend_from_slice(header.as_bytes());
    let done = extract(&finish(tar)[..], layer.path(), Limits::default()).unwrap();
    assert_eq!(done.dropped_devices, 1);
    assert!(!layer.path().join("dev/sda").exists());
    assert_eq!(std::fs::metadata(layer.path().join("bin/su")).unwrap().mode() & 0o7777, 0o4755);
    let foreign = std::fs::metadata(layer.path().join("bin/foreign")).unwrap();
    assert_eq!((foreign.uid(), foreign.gid(), foreign.mode() & 0o7777), (65534, 65534, 0o755));
}

#[test]
fn whiteouts_and_opaque_directories_become_overlay_whiteouts() {
    let layer = tempfile::tempdir().unwrap();
    let mut tar = Vec::new();
    entry(&mut tar, "etc/.wh.motd", T::Regular, b"", "", 0o644);
    entry(&mut tar, "var/cache/.wh..wh..opq", T::Regular, b"", "", 0o644);
    entry(&mut tar, "var/cache/kept", T::Regular, b"k", "", 0o644);
    extract(&finish(tar)[..], layer.path(), Limits::default()).unwrap();
    let motd = std::fs::symlink_metadata(layer.path().join("etc/motd")).unwrap();
    assert!(motd.file_type().is_char_device() && motd.rdev() == 0);
    assert!(!layer.path().join("etc/.wh.motd").exists());
    let opaque = xattr::get(layer.path().join("var/cache"), whiteout::OPAQUE_XATTR).unwrap();
    assert_eq!(opaque.as_deref(), Some(&b"y"[..]));
    assert!(layer.path().join("var/cache/kept").exists());
}

#[test]
fn bombs_stop_at_the_size_and_entry_limits() {
    let layer = tempfile::tempdir().unwrap();
    let mut tar = Vec::new();
    entry(&mut tar, "big", T::Regular, &vec![0u8; 1 << 20], "", 0o644);
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    gz.write_all(&finish(tar)).unwrap();
    let compressed = gz.finish().unwrap();
    assert!(compressed.len() < 8192, "1 MiB of zeros compresses well");
    let plain = image::decompress(&compressed[..]).unwrap();
    let err = extract(plain, layer.path(), Limits { max_bytes: 64 * 1024, max_entries: 100 }).unwrap_err();
    assert!(matches!(err, StoreError::TooLarge(_)), "{err}");

    let layer = tempfile::tempdir().unwrap();
    let mut tar = Vec::new();
    for i in 0..20 {
        entry(&mut tar, &format!("f{i}"), T::Regular, b"", "", 0o644);
    }
    let err = extract(&finish(tar)[..], layer.path(), Limits { max_bytes: 1 << 20, max_entries: 10 }).unwrap_err();
    assert!(matches!(err, StoreError::TooLarge(_)), "{err}");
}

/// Writes an OCI layout with the given layer tars (gzip) into `dir`; returns the layer digests.
pub(super) fn write_oci_layout(dir: &Path, layers: &[Vec<u8>]) -> Vec<Digest> {
    let blobs = dir.join("blobs/sha256");
    std::fs::create_dir_all(&blobs).unwrap();
    let put = |bytes: &[u8]| {
        let d = Digest::of(bytes);
        std::fs::write(blobs.join(d.hex()), bytes).unwrap();
        d
    };
    let (mut descs, mut diff_ids, mut digests) = (Vec::new(), Vec::new(), Vec::new());
    for layer in layers {
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        gz.write_all(layer).unwrap();
        let blob = gz.finish().unwrap();
        let d = put(&blob);
        diff_ids.push(Digest::of(layer).to_string());
        descs.push(serde_json::json!({"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", "digest": d.as_str(), "size": blob.len()}));
        digests.push(d);
    }
    let config = serde_json::json!({"architecture": "amd64", "os": "linux",
        "config": {"Env": ["PATH=/usr/bin:/bin", "LANG=C.UTF-8"], "WorkingDir": "/work", "Cmd": ["/bin/sh"]},
        "rootfs": {"type": "layers", "diff_ids": diff_ids}});
    let config = serde_json::to_vec(&config).unwrap();
    let cd = put(&config);
    let manifest = serde_json::to_vec(&serde_json::json!({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": cd.as_str(), "size": config.len()},
        "layers": descs})).unwrap();
    let md = put(&manifest);
    let index = serde_json::json!({"schemaVersion": 2, "manifests": [{"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": md.as_str(), "size": manifest.len()}]});
    std::fs::write(dir.join("index.json"), serde_json::to_vec(&index).unwrap()).unwrap();
    std::fs::write(dir.join("oci-layout"), r#"{"imageLayoutVersion":"1.0.0"}"#).unwrap();
    digests
}

#[test]
fn import_shares_layers_verifies_digests_enforces_the_limit_and_gc_frees_unused_layers() {
    let state = tempfile::tempdir().unwrap();
    let store = Store::open(state.path(), 64).unwrap();
    let mut base = Vec::new();
    entry(&mut base, "etc/os-release", T::Regular, b"ID=test\n", "", 0o644);
    let base = finish(base);
    let mut top = Vec::new();
    entry(&mut top, "etc/.wh.os-release", T::Regular, b"", "", 0o644);
    let top = finish(top);
    let src = tempfile::tempdir().unwrap();
    let digests = write_oci_layout(src.path(), &[base.clone(), top]);
    let one = store.import("one", src.path()).unwrap();
    assert_eq!(one.layers, digests.iter().map(|d| d.to_string()).collect::<Vec<_>>());
    assert_eq!(one.config.workdir, "/work");
    let src2 = tempfile::tempdir().unwrap();
    write_oci_layout(src2.path(), &[base]);
    store.import("two", src2.path()).unwrap();
    assert_eq!(std::fs::read_dir(store.layout.dir.join("layers")).unwrap().count(), 2, "the base is stored once");
    assert_eq!(store.lookup(&one.template_id).unwrap().unwrap().name, "one");
    assert_eq!(store.lowers(&one).unwrap().len(), 2);

    // A blob that is not what its digest says is refused and leaves nothing behind.
    let mut other = Vec::new();
    entry(&mut other, "swapped", T::Regular, b"not the digested content", "", 0o644);
    let wrong = Digest::of(b"something else");
    let _lock = store.lock().unwrap();
    let err = store.ingest_layer(&finish(other)[..], Some(&wrong), None).unwrap_err();
    assert!(matches!(err, StoreError::DigestMismatch { .. }), "{err}");
    assert!(store.layout.layer_meta(&wrong).is_none() && !store.layout.layer_dir(&wrong).exists());
    assert_eq!(std::fs::read_dir(store.layout.tmp()).unwrap().count(), 0);
    drop(_lock);
    // So is a blob swapped in an OCI layout (here caught by its size in the manifest).
    let bad = tempfile::tempdir().unwrap();
    let d = write_oci_layout(bad.path(), &[finish(Vec::new())]);
    std::fs::write(bad.path().join("blobs/sha256").join(d[0].hex()), b"swapped").unwrap();
    assert!(store.import("bad", bad.path()).is_err());
    assert!(store.lookup("bad").unwrap().is_none());

    // The limit: a 1 MiB store cannot take a 2 MiB layer.
    let small = Store::open(state.path(), 1).unwrap();
    let mut big = Vec::new();
    entry(&mut big, "big", T::Regular, &vec![7u8; 2 << 20], "", 0o644);
    let big_src = tempfile::tempdir().unwrap();
    write_oci_layout(big_src.path(), &[finish(big)]);
    let err = small.import("big", big_src.path()).unwrap_err();
    assert!(err.to_string().contains("local.template_store_limit_mb"), "{err}");

    let _lock = store.lock().unwrap();
    store.remove("one").unwrap();
    // Build cache entries: one naming a layer gc removes, one without a layer, one unreadable.
    let cache = store.layout.dir.join("cache");
    std::fs::create_dir_all(&cache).unwrap();
    let one_layer = store.layout.read_record("two").unwrap().unwrap().layers.len();
    assert_eq!(one_layer, 1);
    let gone = format!("sha256:{}", "0".repeat(64));
    std::fs::write(cache.join("a.json"), serde_json::json!({"layer": gone}).to_string()).unwrap();
    std::fs::write(cache.join("b.json"), r#"{"layer": null, "user": "u", "workdir": "/", "env": []}"#).unwrap();
    std::fs::write(cache.join("c.json"), "not json").unwrap();
    let report = store.gc(state.path()).unwrap();
    assert_eq!((report.removed_layers, report.kept_layers), (1, 1));
    assert_eq!(report.removed_build_files, 2);
    assert!(cache.join("b.json").exists() && !cache.join("a.json").exists());
    assert!(store.lookup("one").unwrap().is_none() && store.lookup("two").unwrap().is_some());
    assert!(matches!(validate_name("../x"), Err(StoreError::BadName(_))));
}

#[test]
fn opening_the_store_removes_what_a_killed_writer_left_and_keeps_live_work() {
    let state = tempfile::tempdir().unwrap();
    let store = Store::open(state.path(), 64).unwrap();
    let tmp = store.layout.tmp();
    // pid 4194305 is past the kernel's largest pid_max: that writer is surely dead.
    let dead = tmp.join("layer-4194305-abc");
    std::fs::create_dir_all(dead.join("fs/usr")).unwrap();
    std::fs::write(tmp.join("write-4194305-abc"), b"half a record").unwrap();
    let live = tmp.join(format!("blob-{}-def", std::process::id()));
    std::fs::create_dir_all(&live).unwrap();
    Store::open(state.path(), 64).unwrap();
    assert!(!dead.exists() && !tmp.join("write-4194305-abc").exists());
    assert!(live.exists(), "work of a running process stays");
    assert_eq!(std::fs::read_dir(store.layout.dir.join("layers")).unwrap().count(), 0);
}

#[test]
fn a_docker_save_tarball_imports_with_its_layers_checked_against_the_diff_ids() {
    let state = tempfile::tempdir().unwrap();
    let store = Store::open(state.path(), 64).unwrap();
    let mut layer = Vec::new();
    entry(&mut layer, "etc/saved", T::Regular, b"from docker save\n", "", 0o644);
    let layer = finish(layer);
    let config = serde_json::to_vec(&serde_json::json!({"architecture": "amd64", "os": "linux",
        "config": {"User": "1000", "WorkingDir": "/home/user"},
        "rootfs": {"type": "layers", "diff_ids": [Digest::of(&layer).as_str()]}}))
    .unwrap();
    let config_name = format!("{}.json", Digest::of(&config).hex());
    let manifest = serde_json::to_vec(&serde_json::json!([{"Config": config_name, "RepoTags": ["x:1"],
        "Layers": ["abc/layer.tar"]}]))
    .unwrap();
    // Docker 25+ writes layers as blobs and the legacy paths as symlinks to them.
    let mut archive = tar::Builder::new(Vec::new());
    let mut add = |path: &str, data: &[u8]| {
        let mut h = tar::Header::new_gnu();
        h.set_size(data.len() as u64);
        h.set_mode(0o644);
        h.set_mtime(0);
        h.set_uid(0);
        h.set_gid(0);
        h.set_cksum();
        archive.append_data(&mut h, path, data).unwrap();
    };
    add("manifest.json", &manifest);
    add(&config_name, &config);
    add(&format!("blobs/sha256/{}", Digest::of(&layer).hex()), &layer);
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(T::Symlink);
    h.set_size(0);
    h.set_mode(0o777);
    h.set_mtime(0);
    h.set_uid(0);
    h.set_gid(0);
    archive.append_link(&mut h, "abc/layer.tar", format!("../blobs/sha256/{}", Digest::of(&layer).hex())).unwrap();
    let tarball = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(tarball.path(), archive.into_inner().unwrap()).unwrap();

    let record = store.import("saved", tarball.path()).unwrap();
    assert_eq!(record.layers, vec![Digest::of(&layer).to_string()]);
    assert_eq!((record.config.user.as_str(), record.config.workdir.as_str()), ("1000", "/home/user"));
    let fs = store.lowers(&record).unwrap().remove(0);
    assert_eq!(std::fs::read_to_string(fs.join("etc/saved")).unwrap(), "from docker save\n");
    assert_eq!(std::fs::read_dir(store.layout.tmp()).unwrap().count(), 0, "the unpacked archive is removed");
}

#[test]
fn a_repeated_layer_is_stacked_once_at_its_topmost_place_and_a_missing_one_is_named() {
    let state = tempfile::tempdir().unwrap();
    let store = Store::open(state.path(), 64).unwrap();
    let _lock = store.lock().unwrap();
    let layer = |name: &str| {
        let mut tar = Vec::new();
        entry(&mut tar, name, T::Regular, b"x", "", 0o644);
        store.ingest_layer(&finish(tar)[..], None, None).unwrap()
    };
    let (a, b, c) = (layer("a"), layer("b"), layer("c"));
    let fs = |d: &Digest| store.layout.layer_fs(d);
    assert_eq!(store.layer_stack(&[a.clone(), b.clone(), c.clone()]).unwrap(), vec![fs(&a), fs(&b), fs(&c)]);
    // overlayfs takes a directory once: the lower copy goes, the upper one keeps its place.
    assert_eq!(store.layer_stack(&[a.clone(), b.clone(), a.clone(), c.clone()]).unwrap(), vec![fs(&b), fs(&a), fs(&c)]);
    assert_eq!(store.layer_stack(&[a.clone(), a.clone()]).unwrap(), vec![fs(&a)]);
    let missing = Digest::parse(&format!("sha256:{}", "1".repeat(64))).unwrap();
    assert_eq!(store.layer_stack(&[a, missing.clone()]).unwrap_err(), missing);
}

#[test]
fn a_configured_directory_templates_name_cannot_be_registered() {
    let state = tempfile::tempdir().unwrap();
    let store = Store::open(state.path(), 64).unwrap().reserving(["mine".to_owned()]);
    let err = store.check_name("mine").unwrap_err();
    assert!(matches!(err, StoreError::Reserved(ref n) if n == "mine"), "{err}");
    assert!(err.to_string().contains("\"mine\"") && err.to_string().contains("local.templates"), "{err}");
    assert!(matches!(store.check_name("base"), Err(StoreError::BadName(_))));
    store.check_name("other").unwrap();
    // Every registration goes through the check: a commit, an import.
    let _lock = store.lock().unwrap();
    let err = store.commit_template("mine", Vec::new(), RunConfig::default(), "test".into()).unwrap_err();
    assert!(matches!(err, StoreError::Reserved(_)), "{err}");
    drop(_lock);
    let err = store.import("mine", state.path()).unwrap_err();
    assert!(matches!(err, StoreError::Reserved(_)), "{err}");
    assert!(store.lookup("mine").unwrap().is_none());
    // The same store unreserved registers it.
    let plain = Store::open(state.path(), 64).unwrap();
    plain.commit_template("mine", Vec::new(), RunConfig::default(), "test".into()).unwrap();
}
