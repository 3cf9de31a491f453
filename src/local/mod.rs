//! The embedded E2B-compatible local provider: control plane, per-sandbox
//! isolation, and the in-sandbox envd agent.
//!
//! Entry points: [`start_provider`] (library, used by `serve`), [`run_provider`]
//! (`sandbox-mcp provider`) and [`run_envd`] (`sandbox-mcp envd`, internal: the
//! sandbox's PID 1).
//!
//! One folder per concern, lowest first (a folder imports only the ones above it in this list):
//!
//! - `fds.rs`: descriptor hygiene before an `exec`, shared by the sandbox launcher and envd;
//! - `envd/`: the in-sandbox agent (processes and files over Connect and `/files`);
//! - `net/`: a network namespace per sandbox and the provider's egress relays and rule check;
//! - `template/`: template roots (`base` from an allow-list of the host, directories, stored
//!   templates as stacked layers);
//! - `isolation/`: the layers around every sandbox (namespaces at spawn, the in-sandbox set-up,
//!   user namespace, seccomp, cgroups, disk), and the spec the agent builds its sandbox from;
//! - `store/`: the template store (content-addressed layers, OCI import and pulls, GC, a
//!   sandbox's writes made a layer);
//! - `control/`: the sandbox table and lifecycle, records, ids, agent processes, settings;
//! - `build/`: template builds (steps run in step sandboxes, harvested into layers);
//! - `api/`: the HTTP surface: the control plane, the data-plane proxy, their error answer;
//! - this file: the entry points, which start the provider and run the agent.

pub mod api;
pub mod build;
pub mod control;
pub mod envd;
#[allow(unsafe_code)] // system calls; every block has a SAFETY comment
pub mod fds;
pub mod isolation;
#[allow(unsafe_code)] // system calls; every block has a SAFETY comment
pub mod net;
pub mod store;
pub mod template;

use std::net::SocketAddr;
use std::os::fd::FromRawFd;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;

use control::{sandbox_table, state_lock};
use isolation::{agent_spawn, sandbox_init, spec, userns};

use control::provider_config;

pub use control::provider_config::LocalProviderConfig;

/// Arguments of `sandbox-mcp provider`. The settings come from the `[local]` section (and the
/// listener limits from `[server]`) of `--config` and `SANDBOX_MCP_<SECTION>__<KEY>`, exactly as
/// for `serve`'s embedded provider; each flag given overrides its key. Defaults: `config/local.toml`.
#[derive(Debug, Clone, clap::Args)]
pub struct ProviderArgs {
    /// TOML config file: its `[local]` section, `server.max_connections`,
    /// `server.header_read_timeout_secs`, `server.idle_timeout_secs` and `sandbox.max_timeout_secs`
    /// are read (see config/local.toml).
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Address to listen on (control plane and envd data plane on one port). Port 0 picks a free port;
    /// the bound address is printed on stdout.
    #[arg(long, default_value = "127.0.0.1:3000")]
    pub listen: SocketAddr,
    /// State directory (sandbox records and writable layers), `local.state_dir`.
    /// Default: /var/lib/sandbox-mcp as root, else $XDG_STATE_HOME/sandbox-mcp or ~/.local/state/sandbox-mcp.
    #[arg(long)]
    pub state_dir: Option<PathBuf>,
    /// Required X-API-Key. Without one, any key is accepted (loopback only).
    #[arg(long, env = "E2B_API_KEY", hide_env_values = true)]
    pub api_key: Option<String>,
    /// Most sandboxes alive at once (`local.max_sandboxes`).
    #[arg(long)]
    pub max_sandboxes: Option<u32>,
    /// Per-sandbox memory limit in MiB, cgroup memory controller (`local.memory_limit_mb`); 0 = no limit.
    #[arg(long)]
    pub memory_limit_mb: Option<u64>,
    /// Per-sandbox process limit, cgroup pids controller (`local.pids_limit`); 0 = no limit.
    #[arg(long)]
    pub pids_limit: Option<u64>,
    /// Lifetime of a sandbox created without a timeout, seconds.
    #[arg(long, default_value_t = provider_config::DEFAULT_SANDBOX_TIMEOUT_SECS)]
    pub default_timeout: u64,
    /// Longest timeout a client may ask for, seconds (`sandbox.max_timeout_secs`).
    #[arg(long)]
    pub max_timeout: Option<u64>,
    /// Extra template: NAME=ROOT_DIR (repeatable), a root filesystem directory (e.g. a `docker
    /// export` or `mmdebstrap` output), added to `[local.templates]`. `base` is built from an
    /// allow-list of the host.
    #[arg(long = "template", value_parser = parse_template)]
    pub templates: Vec<(String, PathBuf)>,
    /// Upstream resolver of the sandboxes' DNS forwarder (repeatable; replaces `local.dns_servers`).
    /// Default: the host's /etc/resolv.conf nameservers.
    #[arg(long = "dns-server")]
    pub dns_servers: Vec<std::net::IpAddr>,
    /// An address of this host that sandboxes may reach when their allowOut names it (repeatable;
    /// replaces `local.open_host_addresses`). Without any, no sandbox ever reaches any of the
    /// host's own addresses.
    #[arg(long = "open-host-address")]
    pub open_host_addresses: Vec<std::net::IpAddr>,
    /// Domain reported for `{port}-{sandboxID}.{domain}` inbound hosts (point a wildcard DNS name at
    /// this provider), `local.domain`; empty = none.
    #[arg(long)]
    pub domain: Option<String>,
    /// Host uid/gid range START:COUNT (as in /etc/subuid) that ids inside sandboxes map to (`local.id_range`).
    #[arg(long, value_parser = parse_id_range)]
    pub id_range: Option<String>,
    /// Per-sandbox disk limit in MiB, a sparse ext4 image per sandbox (`local.disk_limit_mb`); 0 = no limit.
    #[arg(long)]
    pub disk_limit_mb: Option<u64>,
    /// Most MiB the template store may take (`local.template_store_limit_mb`).
    #[arg(long)]
    pub template_store_limit_mb: Option<u64>,
    /// Seconds a create waits for a stored template's ready command (`local.template_ready_timeout_secs`).
    #[arg(long)]
    pub template_ready_timeout_secs: Option<u64>,
    /// Most snapshots kept at once (`local.max_snapshots`).
    #[arg(long)]
    pub max_snapshots: Option<u32>,
    /// Seconds a sandbox paused at its deadline (`lifecycle.on_timeout = "pause"`) is kept before
    /// it is removed (`local.paused_retention_secs`).
    #[arg(long)]
    pub paused_retention_secs: Option<u64>,
    /// What a snapshot request naming no mode gets (`local.default_snapshot_mode`): `full` is
    /// refused with the mode that works; `filesystem` takes a filesystem snapshot.
    #[arg(long, value_enum)]
    pub default_snapshot_mode: Option<crate::local::control::provider_config::SnapshotMode>,
    /// Most HTTP connections open at once, the longest-idle one closed to make room (`server.max_connections`).
    #[arg(long)]
    pub max_connections: Option<usize>,
    /// Seconds a client has to send a request's headers (`server.header_read_timeout_secs`).
    #[arg(long)]
    pub header_read_timeout: Option<u64>,
    /// Seconds after which a connection with no request in flight is closed (`server.idle_timeout_secs`).
    #[arg(long)]
    pub idle_timeout: Option<u64>,
}

impl ProviderArgs {
    /// The provider's configuration: `--config` and the environment, then these flags.
    pub fn provider_config(&self) -> anyhow::Result<LocalProviderConfig> {
        let config = crate::config::Config::load(self.config.as_deref())?;
        self.provider_config_from(config)
    }

    /// The provider's configuration from an already loaded `config` with these flags applied: a
    /// flag given replaces its key (0 meaning no limit, as in the file), `--template` adds to
    /// `[local.templates]`.
    pub fn provider_config_from(&self, mut config: crate::config::Config) -> anyhow::Result<LocalProviderConfig> {
        let local = &mut config.local;
        let zero_is_none = |n: u64| (n > 0).then_some(n);
        if let Some(dir) = &self.state_dir {
            local.state_dir = Some(dir.clone());
        }
        if let Some(n) = self.max_sandboxes {
            local.max_sandboxes = n;
        }
        if let Some(n) = self.memory_limit_mb {
            local.memory_limit_mb = zero_is_none(n);
        }
        if let Some(n) = self.pids_limit {
            local.pids_limit = zero_is_none(n);
        }
        if let Some(n) = self.disk_limit_mb {
            local.disk_limit_mb = zero_is_none(n);
        }
        if let Some(n) = self.template_store_limit_mb {
            local.template_store_limit_mb = n;
        }
        if let Some(n) = self.template_ready_timeout_secs {
            local.template_ready_timeout_secs = n;
        }
        if let Some(n) = self.max_snapshots {
            local.max_snapshots = n;
        }
        if let Some(n) = self.paused_retention_secs {
            local.paused_retention_secs = n;
        }
        if let Some(mode) = self.default_snapshot_mode {
            local.default_snapshot_mode = mode;
        }
        local.templates.extend(self.templates.iter().cloned());
        if !self.dns_servers.is_empty() {
            local.dns_servers = self.dns_servers.clone();
        }
        if !self.open_host_addresses.is_empty() {
            local.open_host_addresses = self.open_host_addresses.clone();
        }
        if let Some(domain) = &self.domain {
            local.domain = Some(domain.clone()).filter(|d| !d.is_empty());
        }
        if let Some(range) = &self.id_range {
            local.id_range = range.clone();
        }
        let server = &mut config.server;
        if let Some(n) = self.max_connections {
            server.max_connections = n;
        }
        if let Some(secs) = self.header_read_timeout {
            server.header_read_timeout_secs = secs.max(1);
        }
        if let Some(secs) = self.idle_timeout {
            server.idle_timeout_secs = secs.max(1);
        }
        if let Some(secs) = self.max_timeout {
            anyhow::ensure!(secs > 0, "--max-timeout must be at least 1 second");
            config.sandbox.max_timeout_secs = secs;
        }
        let mut cfg = config.local_provider()?;
        cfg.api_key = self.api_key.clone().filter(|k| !k.is_empty());
        cfg.default_timeout_secs = self.default_timeout;
        Ok(cfg)
    }
}

// Clap value parsers: their errors are `String`, clap's convention for them.
fn parse_id_range(s: &str) -> Result<String, String> {
    s.parse::<userns::IdMap>().map(|_| s.to_owned()).map_err(|e| e.to_string())
}

fn parse_template(s: &str) -> Result<(String, PathBuf), String> {
    let (name, root) = s.split_once('=').ok_or("expected NAME=ROOT_DIR")?;
    Ok((name.to_owned(), PathBuf::from(root)))
}

/// Arguments of the internal `sandbox-mcp envd`.
#[derive(Debug, Clone, clap::Args)]
pub struct EnvdArgs {
    /// The sandbox's directory on the host (holds its spec and socket). The provider passes it
    /// as `--sandbox-dir-fd` instead, so that no argv names it.
    #[arg(long, required_unless_present = "sandbox_dir_fd")]
    pub sandbox_dir: Option<PathBuf>,
    /// Descriptor of the sandbox's directory (`O_PATH`), in place of `--sandbox-dir`.
    #[arg(long)]
    pub sandbox_dir_fd: Option<i32>,
    /// The random name by which the provider finds this agent among the host's processes
    /// (see `agent_process`); envd itself does not use it.
    #[arg(long)]
    pub agent_tag: Option<String>,
    /// Descriptor on which to report readiness (`ok`) or the set-up error.
    #[arg(long)]
    pub ready_fd: Option<i32>,
    /// Descriptor of the sandbox's disk, mounted ahead of time by the provider (a detached mount).
    #[arg(long)]
    pub disk_fd: Option<i32>,
    /// Descriptor of the sandbox's user namespace, made ahead of time by the provider.
    #[arg(long)]
    pub userns_fd: Option<i32>,
}

/// A provider serving in the background.
pub struct RunningProvider {
    /// The address it listens on.
    pub addr: SocketAddr,
    /// The sandbox table (e.g. to kill everything on an explicit clean shutdown).
    pub provider: Arc<sandbox_table::SandboxTable>,
    shutdown: tokio_util::sync::CancellationToken,
    server: tokio::task::JoinHandle<()>,
    _lock: state_lock::StateLock,
}

impl RunningProvider {
    /// Stops accepting requests and the reaper; sandboxes keep running (re-adopted on the next start).
    /// Also lets the clean-up of already killed sandboxes finish (up to 5 s).
    pub async fn shutdown(self) {
        self.shutdown.cancel();
        let _ = tokio::time::timeout(Duration::from_secs(5), self.server).await;
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        while self.provider.cleanups_in_flight() > 0 && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Kills every sandbox (waiting for their clean-up), then shuts down. For tests and ephemeral
    /// embeddings whose state directory is about to be deleted: sandboxes left running there would
    /// be orphaned for good.
    pub async fn kill_all_and_shutdown(self) {
        self.provider.kill_all().await;
        self.shutdown().await;
    }
}

/// How often records, the state directory and live agents are reconciled (see
/// [`sandbox_table::SandboxTable::reconcile_once`]).
pub const RECONCILE_INTERVAL: Duration = Duration::from_secs(10);

/// Starts the provider on `listener`: checks isolation is permitted, re-adopts sandboxes left by a
/// previous run, starts the deadline reaper, and serves until [`RunningProvider::shutdown`].
pub async fn start_provider(
    cfg: LocalProviderConfig,
    listener: tokio::net::TcpListener,
) -> anyhow::Result<RunningProvider> {
    let addr = listener.local_addr().context("reading the listening address")?;
    if cfg.api_key.is_none() && !addr.ip().is_loopback() {
        anyhow::bail!(
            "refusing to listen on {addr} without an API key: set --api-key or E2B_API_KEY, or listen on 127.0.0.1"
        );
    }
    std::fs::create_dir_all(&cfg.state_dir)
        .with_context(|| format!("cannot create the state directory {}", cfg.state_dir.display()))?;
    let lock = state_lock::StateLock::acquire(&cfg.state_dir)?;
    let probe_dir = cfg.state_dir.join(format!(".probe-{}", std::process::id()));
    tokio::task::spawn_blocking(move || agent_spawn::probe_isolation(&probe_dir))
        .await
        .context("isolation probe")??;
    tokio::task::spawn_blocking(net::netns::probe).await.context("network probe")??;
    let provider = Arc::new(
        tokio::task::spawn_blocking(move || sandbox_table::SandboxTable::new(cfg))
            .await
            .context("preparing the provider")??,
    );
    provider.adopt_existing().await;
    provider.warm_network_pool();

    let shutdown = tokio_util::sync::CancellationToken::new();
    let reaper_provider = provider.clone();
    let reaper_stop = shutdown.clone();
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_millis(250));
        let mut reconcile = tokio::time::interval(RECONCILE_INTERVAL);
        loop {
            tokio::select! {
                _ = reaper_stop.cancelled() => break,
                _ = tick.tick() => reaper_provider.reap_once().await,
                _ = reconcile.tick() => {
                    let cleaned = reaper_provider.reconcile_once().await;
                    if cleaned > 0 {
                        tracing::warn!(cleaned, "reconciliation cleaned up untracked sandboxes");
                    }
                }
            }
        }
    });

    let limits = provider.cfg.listen_limits;
    let app = api::router(Arc::new(api::AppState::new(provider.clone())));
    let stop = shutdown.clone();
    // Connection cap, header-read and idle timeouts, accept back-off (see `crate::listen`);
    // TCP_NODELAY so small Connect frames never wait for Nagle's algorithm.
    let server = tokio::spawn(crate::listen::serve("provider", listener, app, limits, stop.cancelled_owned()));
    tracing::info!(%addr, "local provider listening");
    Ok(RunningProvider { addr, provider, shutdown, server, _lock: lock })
}

/// Runs the provider until SIGINT/SIGTERM.
pub fn run_provider(args: ProviderArgs) -> anyhow::Result<()> {
    crate::logging::init(crate::logging::LogFormat::Auto);
    let cfg = args.provider_config()?;
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().context("starting tokio")?;
    runtime.block_on(async move {
        let listener = tokio::net::TcpListener::bind(args.listen)
            .await
            .with_context(|| format!("cannot listen on {} (--listen)", args.listen))?;
        let running = start_provider(cfg, listener).await?;
        // Not `println!`, which panics when stdout is a broken pipe.
        use std::io::Write;
        let mut stdout = std::io::stdout();
        let _ =
            writeln!(stdout, "sandbox-mcp provider listening on http://{}", running.addr).and_then(|()| stdout.flush());
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
        tracing::info!("shutting down; sandboxes keep running and are re-adopted on the next start");
        running.shutdown().await;
        Ok(())
    })
}

/// Parses envd's own arguments (those after `envd`) with a command that knows only them, then
/// runs the agent: its start touches none of the code that builds the full command line.
pub fn run_envd_from_args(args: impl IntoIterator<Item = std::ffi::OsString>) -> anyhow::Result<()> {
    use clap::{Args, FromArgMatches};
    let command = EnvdArgs::augment_args(clap::Command::new("envd").no_binary_name(true));
    let matches = command.try_get_matches_from(args)?;
    run_envd(EnvdArgs::from_arg_matches(&matches)?)
}

/// Runs the in-sandbox agent: builds the sandbox around itself, reports readiness, then serves envd.
#[allow(unsafe_code)] // adopts the descriptors the provider passed; see the SAFETY comments
pub fn run_envd(args: EnvdArgs) -> anyhow::Result<()> {
    // Exec'd through /proc/self/exe, the process would be called "exe" in `ps`.
    // SAFETY: PR_SET_NAME copies at most 16 bytes from a NUL-terminated string.
    unsafe { libc::prctl(libc::PR_SET_NAME, c"envd".as_ptr()) };
    // SAFETY: the provider passes a pipe write end at this descriptor and nothing else owns it.
    let mut ready = args.ready_fd.map(|fd| unsafe { std::fs::File::from_raw_fd(fd) });
    // SAFETY: the provider passes its detached disk mount at this descriptor and nothing else owns it.
    let disk = args.disk_fd.map(|fd| unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) });
    // SAFETY: the provider passes the sandbox's user namespace at this descriptor and nothing else owns it.
    let userns = args.userns_fd.map(|fd| unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) });
    // SAFETY: the provider passes the sandbox directory (O_PATH) at this descriptor and nothing else owns it.
    let dir_fd = args.sandbox_dir_fd.map(|fd| unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) });
    let setup = move || -> anyhow::Result<(std::os::unix::net::UnixListener, Option<i32>, spec::SandboxSpec)> {
        let sandbox_dir = match (args.sandbox_dir, &dir_fd) {
            (Some(dir), _) => dir,
            (None, Some(fd)) => {
                let link = format!("/proc/self/fd/{}", std::os::fd::AsRawFd::as_raw_fd(fd));
                std::fs::read_link(&link).with_context(|| format!("resolving --sandbox-dir-fd ({link})"))?
            }
            (None, None) => anyhow::bail!("--sandbox-dir or --sandbox-dir-fd is required"),
        };
        drop(dir_fd);
        let spec: spec::SandboxSpec = control::record::read_json(&sandbox_dir.join(spec::SPEC_FILE))?;
        let (listener, data_fd) = sandbox_init::enter_sandbox(&sandbox_dir, &spec, disk, userns)?;
        listener.set_nonblocking(true).context("non-blocking socket")?;
        Ok((listener, data_fd, spec))
    };
    let (listener, data_fd, spec) = match setup() {
        Ok(done) => done,
        Err(err) => {
            if let Some(pipe) = ready.as_mut() {
                let _ = std::io::Write::write_all(pipe, format!("{err:#}\n").as_bytes());
            }
            return Err(err);
        }
    };
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().context("starting tokio")?;
    runtime.block_on(async move {
        let listener = tokio::net::UnixListener::from_std(listener).context("adopting the envd socket")?;
        if let Some(mut pipe) = ready.take() {
            let _ = std::io::Write::write_all(&mut pipe, spec::ready_line(data_fd).as_bytes());
        }
        let opts = envd::EnvdOptions {
            sandbox_id: spec.sandbox_id.clone(),
            env_vars: spec.env_vars.clone(),
            default_user: "user".into(),
            reap_orphans: true,
        };
        envd::serve(listener, opts).await
    })
}
