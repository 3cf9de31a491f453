//! Template names to the layers a sandbox stacks: `local.templates` directories, `base`, and the
//! template store's records (by name, template id, alias or `NAME:TAG`; read on every create, so
//! imports need no restart), a snapshot's over the root template it was taken on. Each comes with
//! its [`Lineage`], which a snapshot of the sandbox starts from.

use std::collections::BTreeMap;

use super::{ProviderError, SandboxTable};
use crate::local::store::{Digest, Lineage, RunConfig};
use crate::local::template::TemplateRoot;

/// A template ready to start a sandbox of: its lower layers, its process configuration (a
/// stored template's start and ready commands; empty for the others) and its lineage.
#[derive(Debug, Clone)]
pub struct ResolvedTemplate {
    pub root: TemplateRoot,
    pub config: RunConfig,
    pub lineage: Lineage,
}

impl SandboxTable {
    /// The template `name`, if it exists.
    pub fn resolve_template(&self, name: &str) -> Result<Option<ResolvedTemplate>, ProviderError> {
        if let Some(root) = self.root_template(name) {
            let lineage = Lineage { root_template: Some(name.to_owned()), private_home: true, ..Lineage::default() };
            return Ok(Some(ResolvedTemplate { root, config: RunConfig::default(), lineage }));
        }
        let Some(store) = &self.store else { return Ok(None) };
        let internal = |e: crate::local::store::StoreError| ProviderError::Internal(format!("template store: {e}"));
        let Some(record) = store.lookup(name).map_err(internal)? else { return Ok(None) };
        let (root_template, extra) = match &record.snapshot {
            Some(of) => (of.root_template.clone(), of.extra.clone()),
            None => (None, BTreeMap::new()),
        };
        let lineage = Lineage { root_template, layers: record.layers.clone(), extra, private_home: false };
        self.stack(&record.name, lineage, record.config).map(Some)
    }

    /// `base` or a configured directory template.
    fn root_template(&self, name: &str) -> Option<TemplateRoot> {
        if let Some(root) = self.cfg.templates.get(name) {
            return Some(TemplateRoot::directory(root.clone()));
        }
        (name == "base").then(|| self.base.clone())
    }

    /// The lower layers of `lineage` (whose `private_home` must be false: the layers carry
    /// `/home` and `/root`). `name` names the template in errors.
    pub fn stack(&self, name: &str, lineage: Lineage, config: RunConfig) -> Result<ResolvedTemplate, ProviderError> {
        let store = self.store.as_ref().ok_or_else(|| {
            ProviderError::Internal(format!("template '{name}' is in the template store, which cannot be opened"))
        })?;
        let lowers = |digests: &[String]| -> Result<Vec<std::path::PathBuf>, ProviderError> {
            let parsed = digests
                .iter()
                .map(|d| Digest::parse(d))
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| ProviderError::Internal(format!("template '{name}': {e}")))?;
            store.layer_stack(&parsed).map_err(|missing| {
                ProviderError::Internal(format!(
                    "template '{name}' names the layer {missing}, which is no longer stored"
                ))
            })
        };
        let stacked = lowers(&lineage.layers)?;
        let root = match &lineage.root_template {
            None => TemplateRoot::stacked(stacked)
                .ok_or_else(|| ProviderError::Internal(format!("template '{name}' has no layers")))?,
            Some(under) => {
                let mut root = self.root_template(under).ok_or_else(|| {
                    ProviderError::BadRequest(format!(
                        "template '{name}' is a snapshot of a sandbox of template '{under}', which this provider no \
                         longer serves (configure it again in local.templates)"
                    ))
                })?;
                root.lowers.extend(stacked);
                // The snapshot's layers carry /home and /root (see `local::snapshot`).
                root.stored = true;
                for (target, digests) in &lineage.extra {
                    let above = lowers(digests)?;
                    let layer = root.layers.iter_mut().find(|l| &l.target == target).ok_or_else(|| {
                        ProviderError::BadRequest(format!(
                            "template '{name}' is a snapshot with writes below /{target}, which template '{under}' \
                             no longer has as a layer"
                        ))
                    })?;
                    layer.above = above;
                }
                root
            }
        };
        Ok(ResolvedTemplate { root, config, lineage })
    }
}
