//! Unit tests of `sandbox_plan` that need no root: the plan `enter_sandbox` carries out (the
//! overlay layers, `/proc`, `/dev`, the private directories, the hidden state directory).

use std::path::{Path, PathBuf};

use nix::mount::MsFlags;

use super::*;
use crate::local::template::Layer;

const DIR: &str = "/var/lib/sandbox-mcp/sandboxes/sbx1";
const STATE: &str = "/var/lib/sandbox-mcp";
const HOST_ROOT: u32 = 1_000_000_000;

fn spec() -> SandboxSpec {
    SandboxSpec {
        sandbox_id: "sbx1".into(),
        template_root: PathBuf::from(STATE).join("templates/t/root"),
        state_dir: STATE.into(),
        env_vars: Default::default(),
        allow_internet_access: false,
        user_uid: 1000,
        user_gid: 1000,
        template_layers: Vec::new(),
        template_lowers: Vec::new(),
        id_map: IdMap { host_base: HOST_ROOT, count: 65536 },
        disk_image: None,
        home_from_template: false,
    }
}

fn plan(spec: &SandboxSpec, has_disk: bool) -> SandboxPlan {
    SandboxPlan::new(Path::new(DIR), spec, has_disk)
}

fn dir(rel: &str) -> PathBuf {
    Path::new(DIR).join(rel)
}

fn usr_layer() -> Layer {
    Layer { target: "usr".into(), source: "/usr".into(), above: Vec::new() }
}

fn extra(plan: &SandboxPlan) -> Vec<&ExtraLayer> {
    plan.layers.extra.iter().map(|l| l.as_ref().unwrap()).collect()
}

/// Every overlay of the plan: the root's, then the extra layers'.
fn overlays(plan: &SandboxPlan) -> Vec<&Overlay> {
    std::iter::once(&plan.layers.root).chain(extra(plan).into_iter().map(|l| &l.overlay)).collect()
}

#[test]
fn the_root_overlay_stacks_a_stored_templates_layers_top_first() {
    let mut spec = spec();
    spec.template_lowers = vec![PathBuf::from("/store/layer-b"), PathBuf::from("/store/layer-c")];
    let plan = plan(&spec, false);
    let binds: Vec<(&Path, &Path)> =
        plan.layers.lowers.iter().map(|l| (l.source.as_path(), l.mount_point.as_path())).collect();
    assert_eq!(
        binds,
        [
            (spec.template_root.as_path(), dir("lower/root").as_path()),
            (Path::new("/store/layer-b"), dir("lower/l1").as_path()),
            (Path::new("/store/layer-c"), dir("lower/l2").as_path()),
        ]
    );
    let root = &plan.layers.root;
    assert_eq!(root.mount.data.as_deref(), Some("lowerdir=lower/l2:lower/l1:lower/root,upperdir=upper,workdir=work"));
    assert_eq!((root.mount.source.as_deref(), root.mount.fstype), (Some(Path::new("overlay")), Some("overlay")));
    assert_eq!(root.mount.target, dir("root"));
    assert_eq!((root.upper.clone(), root.work.clone()), (dir("upper"), dir("work")));
    // The upper layer belongs to the sandbox's root, a host uid of its range.
    assert_eq!(root.owner, HOST_ROOT);
}

#[test]
fn with_a_disk_every_write_lands_on_the_disk() {
    let mut spec = spec();
    spec.template_layers = vec![usr_layer()];
    let image = Path::new(DIR).join("disk.img");
    for (has_disk, disk_image) in [(true, None), (false, Some(image.clone())), (true, Some(image))] {
        spec.disk_image = disk_image;
        let plan = plan(&spec, has_disk);
        assert_eq!(plan.data, dir("disk"));
        assert_eq!(
            plan.layers.root.mount.data.as_deref(),
            Some("lowerdir=lower/root,upperdir=disk/upper,workdir=disk/work")
        );
        let usr = extra(&plan)[0];
        assert_eq!(
            usr.overlay.mount.data.as_deref(),
            Some("lowerdir=lower/usr,upperdir=disk/layers/usr/upper,workdir=disk/layers/usr/work")
        );
        for private in &plan.private {
            assert!(private.source.starts_with(dir("disk")), "{private:?}");
        }
    }
    spec.disk_image = None;
    let plan = plan(&spec, false);
    assert_eq!(plan.data, dir(""));
    assert_eq!(plan.layers.root.mount.data.as_deref(), Some("lowerdir=lower/root,upperdir=upper,workdir=work"));
    assert_eq!(plan.private[0].source, dir("tmp.d"));
}

#[test]
fn overlay_options_name_no_host_path() {
    // The sandbox reads its overlays' options in /proc/self/mountinfo: they must not tell it
    // where the host keeps its state.
    let mut spec = spec();
    spec.template_lowers = vec![PathBuf::from(STATE).join("store/l1")];
    spec.template_layers =
        vec![usr_layer(), Layer { target: "lib64".into(), source: "/lib64".into(), above: Vec::new() }];
    for has_disk in [false, true] {
        let plan = plan(&spec, has_disk);
        let all = overlays(&plan);
        assert_eq!(all.len(), 3);
        for overlay in all {
            let opts = overlay.mount.data.as_deref().unwrap();
            assert!(!opts.contains(STATE), "{opts}");
            for option in opts.split(',') {
                let (key, value) = option.split_once('=').unwrap();
                assert!(["lowerdir", "upperdir", "workdir"].contains(&key), "{opts}");
                for path in value.split(':') {
                    assert!(!path.is_empty() && !path.starts_with('/') && !path.contains(".."), "{opts}");
                    // Each resolves (from the sandbox directory, the cwd) to where the plan makes it.
                    assert!(Path::new(DIR).join(path).starts_with(DIR), "{opts}");
                }
            }
        }
    }
}

#[test]
fn extra_layers_overlay_the_templates_own_directory() {
    let mut spec = spec();
    spec.template_layers = vec![usr_layer()];
    let plan = plan(&spec, false);
    let usr = extra(&plan)[0];
    assert_eq!(usr.target, "usr");
    assert_eq!((usr.bind.source.as_path(), usr.bind.mount_point.clone()), (Path::new("/usr"), dir("lower/usr")));
    assert_eq!(usr.overlay.mount.target, dir("root/usr"));
    assert_eq!(
        (usr.overlay.upper.clone(), usr.overlay.work.clone()),
        (dir("layers/usr/upper"), dir("layers/usr/work"))
    );
    assert_eq!(usr.overlay.owner, HOST_ROOT);
    // No extra layers without template layers (directory and stored templates).
    assert!(self::plan(&self::spec(), false).layers.extra.is_empty());
}

#[test]
fn a_snapshots_layers_stack_above_an_extra_layer_top_first() {
    let mut spec = spec();
    let above = vec![PathBuf::from("/store/a/fs"), PathBuf::from("/store/b/fs")];
    spec.template_layers = vec![Layer { above: above.clone(), ..usr_layer() }];
    let plan = plan(&spec, false);
    let usr = extra(&plan)[0];
    let binds: Vec<(PathBuf, PathBuf)> = usr.above.iter().map(|b| (b.source.clone(), b.mount_point.clone())).collect();
    assert_eq!(binds, vec![(above[0].clone(), dir("lower/usr+1")), (above[1].clone(), dir("lower/usr+2"))]);
    let opts = usr.overlay.mount.data.clone().unwrap_or_default();
    // The newest layer first, the template's own last, all relative to the sandbox directory.
    assert!(opts.starts_with("lowerdir=lower/usr+2:lower/usr+1:lower/usr,"), "{opts}");
}

#[test]
fn template_layer_targets_must_be_plain_top_level_names() {
    let mut spec = spec();
    let targets = ["usr", "", "usr/lib", "..", ".", ".hidden", "/etc", "lib64"];
    spec.template_layers =
        targets.iter().map(|t| Layer { target: (*t).to_owned(), source: "/src".into(), above: Vec::new() }).collect();
    let plan = plan(&spec, false);
    // One entry per layer, in order: mounting stops at the first refused one.
    let outcome: Vec<Result<&str, String>> =
        plan.layers.extra.iter().map(|l| l.as_ref().map(|l| l.target.as_str()).map_err(|e| e.to_string())).collect();
    assert_eq!(
        outcome,
        [
            Ok("usr"),
            Err(r#"invalid template layer target """#.to_owned()),
            Err(r#"invalid template layer target "usr/lib""#.to_owned()),
            Err(r#"invalid template layer target "..""#.to_owned()),
            Err(r#"invalid template layer target ".""#.to_owned()),
            Err(r#"invalid template layer target ".hidden""#.to_owned()),
            Err(r#"invalid template layer target "/etc""#.to_owned()),
            Ok("lib64"),
        ]
    );
}

#[test]
fn proc_and_sys_are_mounted_without_setuid_devices_or_exec_and_sys_read_only() {
    let plan = plan(&spec(), false);
    let locked = MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC;
    assert_eq!((plan.proc.target.clone(), plan.proc.fstype, plan.proc.flags), (dir("root/proc"), Some("proc"), locked));
    assert_eq!(
        (plan.sys.target.clone(), plan.sys.fstype, plan.sys.flags),
        (dir("root/sys"), Some("sysfs"), locked | MsFlags::MS_RDONLY)
    );
    // The procfs envd mounts to make the user namespace is outside the new root.
    assert_eq!((plan.own_proc.target.clone(), plan.own_proc.flags), (dir("lower/proc"), locked));
}

#[test]
fn host_wide_proc_knobs_are_read_only_and_sensitive_files_masked() {
    let guard = |name: &str| PROC_GUARDS.iter().find(|(n, _)| *n == name).map(|(_, g)| *g);
    for name in ["sys", "sysrq-trigger", "irq", "bus", "fs"] {
        assert_eq!(guard(name), Some(ProcGuard::ReadOnly), "{name}");
    }
    for name in ["kcore", "keys", "timer_list", "sched_debug", "config.gz"] {
        assert_eq!(guard(name), Some(ProcGuard::Masked), "{name}");
    }
    for name in ["acpi", "scsi"] {
        assert_eq!(guard(name), Some(ProcGuard::Hidden), "{name}");
    }
    let mut names: Vec<&str> = PROC_GUARDS.iter().map(|(n, _)| *n).collect();
    assert!(names.iter().all(|n| !n.is_empty() && !n.contains('/') && !n.starts_with('.')), "{names:?}");
    names.sort();
    names.dedup();
    assert_eq!(names.len(), PROC_GUARDS.len());

    let path = Path::new("/new/proc/sysrq-trigger");
    let read_only = ProcGuard::ReadOnly.mounts("sysrq-trigger", path);
    assert_eq!(read_only.len(), 2);
    assert_eq!((read_only[0].source.as_deref(), read_only[0].flags), (Some(path), MsFlags::MS_BIND | MsFlags::MS_REC));
    assert_eq!(read_only[1].source, None);
    assert!(read_only[1].flags.contains(MsFlags::MS_BIND | MsFlags::MS_REMOUNT | MsFlags::MS_RDONLY));
    assert!(read_only.iter().all(|m| m.target == path));
    let masked = ProcGuard::Masked.mounts("kcore", Path::new("/new/proc/kcore"));
    assert_eq!(masked.len(), 1);
    assert_eq!((masked[0].source.as_deref(), masked[0].flags), (Some(Path::new("/dev/null")), MsFlags::MS_BIND));
    let hidden = ProcGuard::Hidden.mounts("acpi", Path::new("/new/proc/acpi"));
    assert_eq!(
        (hidden.len(), hidden[0].fstype, hidden[0].data.as_deref()),
        (1, Some("tmpfs"), Some("size=4k,mode=555"))
    );
    assert!(hidden[0].flags.contains(MsFlags::MS_RDONLY));
}

#[test]
fn proc_guards_apply_only_to_what_the_kernel_has() {
    let proc = tempfile::tempdir().unwrap();
    std::fs::create_dir(proc.path().join("sys")).unwrap();
    std::fs::write(proc.path().join("kcore"), "").unwrap();
    std::fs::write(proc.path().join("acpi"), "").unwrap(); // not a directory: nothing to hide
    std::fs::create_dir(proc.path().join("scsi")).unwrap();
    let applied: Vec<&str> =
        PROC_GUARDS.iter().filter(|(name, guard)| guard.applies(&proc.path().join(name))).map(|(n, _)| *n).collect();
    assert_eq!(applied, ["sys", "kcore", "scsi"]);
}

#[test]
fn dev_has_harmless_nodes_its_own_devpts_and_a_bounded_shm() {
    let plan = plan(&spec(), false);
    let dev = &plan.dev;
    let owner = format!("uid={HOST_ROOT},gid={HOST_ROOT}");
    assert_eq!(dev.tmpfs.target, dir("root/dev"));
    assert_eq!(dev.tmpfs.data.as_deref(), Some(format!("mode=755,size=64k,{owner}").as_str()));
    assert!(dev.tmpfs.flags.contains(MsFlags::MS_NOSUID));
    let nodes: Vec<&str> = dev.nodes.iter().map(|(n, _)| *n).collect();
    assert_eq!(nodes, ["null", "zero", "full", "random", "urandom", "tty"]);
    for (node, bind) in &dev.nodes {
        assert_eq!(bind.source.as_deref(), Some(Path::new("/dev").join(node).as_path()));
        assert_eq!((bind.target.clone(), bind.flags), (dir("root/dev").join(node), MsFlags::MS_BIND));
    }
    // A devpts of its own: the host's terminals are not in it.
    let pts = dev.pts.data.as_deref().unwrap();
    assert!(pts.split(',').any(|o| o == "newinstance"), "{pts}");
    assert!(pts.split(',').any(|o| o == format!("gid={}", HOST_ROOT + 5)), "{pts}");
    assert_eq!((dev.pts.target.clone(), dev.pts.fstype), (dir("root/dev/pts"), Some("devpts")));
    assert!(dev.pts.flags.contains(MsFlags::MS_NOSUID | MsFlags::MS_NOEXEC));
    assert_eq!(dev.shm.data.as_deref(), Some(format!("mode=1777,size={},{owner}", 64 * 1024 * 1024).as_str()));
    assert_eq!(dev.shm.flags, MsFlags::MS_NOSUID | MsFlags::MS_NODEV);
    assert!(DEV_LINKS.iter().all(|(_, target)| target.starts_with("/proc/self/fd")));
}

#[test]
fn tmp_home_and_root_are_private_unless_the_template_brings_its_own() {
    let plan = plan(&spec(), false);
    let dirs: Vec<(&str, u32, (u32, u32))> = plan.private.iter().map(|d| (d.name, d.mode, d.owner)).collect();
    let root_owned = (HOST_ROOT, HOST_ROOT);
    assert_eq!(dirs, [("tmp", 0o1777, root_owned), ("home", 0o755, root_owned), ("root", 0o700, root_owned)]);
    for private in &plan.private {
        assert_eq!(private.source, dir(&format!("{}.d", private.name)));
        assert_eq!(private.bind.source.as_deref(), Some(private.source.as_path()));
        assert_eq!(
            (private.bind.target.clone(), private.bind.flags),
            (dir("root").join(private.name), MsFlags::MS_BIND)
        );
    }
    let homes: Vec<Option<&UserHome>> = plan.private.iter().map(|d| d.user_home.as_ref()).collect();
    let user = UserHome { path: dir("root/home/user"), uid: HOST_ROOT + 1000, gid: HOST_ROOT + 1000 };
    assert_eq!(homes, [None, Some(&user), None]);

    // A stored template's sandbox sees the image's own /home and /root; /tmp stays private.
    let mut stored = spec();
    stored.home_from_template = true;
    let names: Vec<&str> = self::plan(&stored, false).private.iter().map(|d| d.name).collect();
    assert_eq!(names, ["tmp"]);
}

#[test]
fn the_state_directory_is_hidden_behind_an_empty_read_only_tmpfs() {
    let hide = plan(&spec(), false).hide_state;
    assert_eq!(hide.target, dir("root").join("var/lib/sandbox-mcp"));
    assert_eq!((hide.fstype, hide.data.as_deref()), (Some("tmpfs"), Some("size=4k,mode=755")));
    assert!(hide.flags.contains(MsFlags::MS_RDONLY | MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC));
    // Under the new root, wherever the provider keeps its state (never the host's own path).
    let mut elsewhere = spec();
    elsewhere.state_dir = "/srv/sandboxes/state".into();
    assert_eq!(plan(&elsewhere, true).hide_state.target, dir("root/srv/sandboxes/state"));
}
