//! `sandbox-mcp template ...`: the operator's commands on the template store
//! (import, pull, list, rm, gc), run beside or without a running provider.

use std::path::PathBuf;

use anyhow::Context;

use super::Store;

/// Arguments of `sandbox-mcp template`.
#[derive(Debug, Clone, clap::Args)]
pub struct TemplateArgs {
    /// Configuration file (TOML): `local.state_dir` and `local.template_store_limit_mb` are read.
    #[arg(long, short = 'c', env = "SANDBOX_MCP_CONFIG", global = true)]
    pub config: Option<PathBuf>,
    /// The provider's state directory (overrides `local.state_dir`).
    #[arg(long, global = true)]
    pub state_dir: Option<PathBuf>,
    #[command(subcommand)]
    pub action: TemplateAction,
}

#[derive(Debug, Clone, clap::Subcommand)]
pub enum TemplateAction {
    /// Import an OCI image layout (directory or tar) or a `docker save` tarball as template NAME.
    Import {
        name: String,
        source: PathBuf,
        #[command(flatten)]
        commands: StartCommands,
    },
    /// Pull REF (e.g. `docker.io/library/debian:bookworm`) from a registry as template NAME.
    Pull {
        name: String,
        reference: String,
        #[command(flatten)]
        commands: StartCommands,
        /// A registry (HOST[:PORT]) that may be reached over plain HTTP (repeatable).
        #[arg(long = "insecure-registry")]
        insecure_registries: Vec<String>,
        /// Registry user name (the password is read from SANDBOX_MCP_REGISTRY_PASSWORD).
        #[arg(long)]
        username: Option<String>,
    },
    /// List the stored templates.
    List,
    /// Remove template NAME (its layers are freed by `gc` once no sandbox uses them).
    Rm { name: String },
    /// Remove the layers no template and no sandbox uses.
    Gc,
}

/// A template's start and ready commands (E2B's `set_start_cmd` / `set_ready_cmd`), stored in its
/// record's config.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct StartCommands {
    /// Command started (`/bin/sh -c`, in the background) in every new sandbox of the template.
    #[arg(long, value_name = "CMD")]
    pub start_cmd: Option<String>,
    /// Command a create waits for to exit 0 (tried every 150 ms, within
    /// `local.template_ready_timeout_secs`).
    #[arg(long, value_name = "CMD")]
    pub ready_cmd: Option<String>,
}

impl StartCommands {
    /// Stores the commands given in template `record`'s config (the others stay as they are).
    fn apply(&self, store: &Store, record: &mut super::TemplateRecord) -> anyhow::Result<()> {
        if self.start_cmd.is_none() && self.ready_cmd.is_none() {
            return Ok(());
        }
        let _lock = store.lock()?;
        if let Some(current) = store.layout.read_record(&record.name)? {
            *record = current;
        }
        if let Some(cmd) = &self.start_cmd {
            record.config.start_cmd = Some(cmd.clone()).filter(|c| !c.trim().is_empty());
        }
        if let Some(cmd) = &self.ready_cmd {
            record.config.ready_cmd = Some(cmd.clone()).filter(|c| !c.trim().is_empty());
        }
        store.layout.write_record(record)?;
        Ok(())
    }
}

/// Runs one `sandbox-mcp template` command.
pub fn run(args: TemplateArgs) -> anyhow::Result<()> {
    crate::logging::init(crate::logging::LogFormat::Auto);
    let config = crate::config::Config::load(args.config.as_deref())?;
    let state_dir = args.state_dir.unwrap_or_else(|| config.local.resolved_state_dir());
    let store = Store::open(&state_dir, config.local.template_store_limit_mb)
        .with_context(|| format!("opening the template store of {}", state_dir.display()))?
        .reserving(config.local.templates.keys().cloned());
    match args.action {
        TemplateAction::Import { name, source, commands } => {
            let mut record = store.import(&name, &source)?;
            commands.apply(&store, &mut record)?;
            println!(
                "imported {} ({} layers, {} MiB, id {})",
                record.name,
                record.layers.len(),
                record.size_bytes >> 20,
                record.template_id
            );
        }
        TemplateAction::Pull { name, reference, commands, insecure_registries, username } => {
            let password = std::env::var("SANDBOX_MCP_REGISTRY_PASSWORD").ok();
            let credentials = match (username, password) {
                (Some(user), Some(password)) => Some(super::registry::Credentials { username: user, password }),
                (Some(_), None) => anyhow::bail!("--username needs the password in SANDBOX_MCP_REGISTRY_PASSWORD"),
                (None, _) => None,
            };
            let options = super::registry::PullOptions { insecure_registries, credentials };
            let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().context("starting tokio")?;
            let mut record = runtime.block_on(super::registry::pull(&store, &name, &reference, &options))?;
            commands.apply(&store, &mut record)?;
            println!(
                "pulled {} ({} layers, {} MiB, id {})",
                record.name,
                record.layers.len(),
                record.size_bytes >> 20,
                record.template_id
            );
        }
        TemplateAction::List => {
            println!("{:<24} {:<22} {:>6} {:>9}  {:<20}  SOURCE", "NAME", "ID", "LAYERS", "SIZE_MIB", "CREATED");
            for r in store.list()? {
                println!(
                    "{:<24} {:<22} {:>6} {:>9}  {:<20}  {}",
                    r.name,
                    r.template_id,
                    r.layers.len(),
                    r.size_bytes >> 20,
                    r.created,
                    r.source
                );
            }
            println!("store: {} MiB of {} MiB", store.usage_bytes() >> 20, store.limit_bytes() >> 20);
        }
        TemplateAction::Rm { name } => {
            let _lock = store.lock()?;
            store.remove(&name)?;
            println!("removed {name}; run `sandbox-mcp template gc` to free its unshared layers");
        }
        TemplateAction::Gc => {
            let _lock = store.lock()?;
            let report = store.gc(&state_dir)?;
            println!(
                "removed {} layers ({} MiB), kept {}; removed {} build cache entries and old uploads",
                report.removed_layers,
                report.freed_bytes >> 20,
                report.kept_layers,
                report.removed_build_files
            );
        }
    }
    Ok(())
}
