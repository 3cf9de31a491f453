//! `list_templates`: the templates `create_sandbox` can start from, as the
//! provider's `GET /templates` lists them (without other tenants' snapshots),
//! with whether background tasks (whose supervisor needs python3 3.8+) run in
//! each.

use http::request::Parts;
use rmcp::handler::server::tool::Extension;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::{Json, tool, tool_router};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::calls::CallContext;
use super::error::ToolError;
use super::snapshot::{has_foreign_prefix, is_owned, refers_to};
use crate::e2b::wire;
use crate::gateway::state::Gateway;

#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ListTemplatesArgs {}

#[derive(Debug, Serialize, JsonSchema)]
pub struct TemplateSummary {
    /// The name to pass to create_sandbox as template (an alias or the template_id works too).
    pub name: String,
    /// Other names of the same template.
    pub aliases: Vec<String>,
    pub template_id: String,
    /// "base" (the host's programs), "directory" (a root filesystem the operator set up),
    /// "stored" (an imported or pulled OCI image) or "snapshot" (one of yours, from snapshot_sandbox);
    /// absent when the provider does not say.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    /// Bytes its layers take, when the provider reports it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub size_bytes: Option<u64>,
    /// When it was created or imported (RFC 3339).
    pub created: String,
    /// The python3 version its sandboxes run ("3.11"), when it has python3 and the provider says.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub python3: Option<String>,
    /// Whether start_task (and run_command as an MCP task) works in its sandboxes: their supervisor
    /// needs python3 3.8 or newer. Absent when the provider does not say (E2B): try it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tasks: Option<bool>,
}

#[derive(Debug, Serialize, JsonSchema)]
pub struct ListTemplatesResult {
    pub templates: Vec<TemplateSummary>,
    /// What create_sandbox uses when template is omitted.
    pub default_template: String,
    /// True if the list was cut to keep the answer under the 1 MiB message limit.
    pub truncated: bool,
}

/// Whether a python3 version ("3.N") runs the task supervisor (3.8 or newer).
pub fn runs_supervisor(version: &str) -> bool {
    version.strip_prefix("3.").and_then(|minor| minor.parse::<u32>().ok()).is_some_and(|minor| minor >= 8)
}

/// One provider template as the tool shows it.
pub fn summary(template: wire::Template) -> TemplateSummary {
    let name =
        template.names.first().or(template.aliases.first()).cloned().unwrap_or_else(|| template.template_id.clone());
    let mut aliases: Vec<String> =
        template.names.iter().chain(&template.aliases).filter(|a| **a != name).cloned().collect();
    aliases.sort();
    aliases.dedup();
    // The local provider says `kind` and leaves `python3` out when there is none; E2B says neither.
    let tasks = match (&template.kind, &template.python3) {
        // Present, version unknown: the start_task check will tell.
        (_, Some(version)) if version == "3" => None,
        (_, Some(version)) => Some(runs_supervisor(version)),
        (Some(_), None) => Some(false),
        (None, None) => None,
    };
    TemplateSummary {
        name,
        aliases,
        template_id: template.template_id,
        kind: template.kind,
        size_bytes: template.size_bytes,
        created: template.created_at,
        python3: template.python3,
        tasks,
    }
}

/// Whose snapshot a template is.
#[derive(Debug, PartialEq, Eq)]
enum SnapshotOwner {
    NotASnapshot,
    Caller,
    /// Another tenant's or another deployment's: never shown.
    Someone,
}

/// Whether `template` is one of the provider's `snapshots` (or carries a snapshot prefix) and whose.
fn snapshot_owner(template: &wire::Template, snapshots: &[wire::SnapshotInfo], prefix: &str) -> SnapshotOwner {
    let references: Vec<&str> = std::iter::once(&template.template_id)
        .chain(&template.names)
        .chain(&template.aliases)
        .map(String::as_str)
        .filter(|r| !r.is_empty())
        .collect();
    if references.iter().any(|r| has_foreign_prefix(r, prefix)) {
        return SnapshotOwner::Someone;
    }
    let matching: Vec<&wire::SnapshotInfo> =
        snapshots.iter().filter(|s| references.iter().any(|r| refers_to(s, r))).collect();
    if matching.is_empty() {
        // A template the provider calls a snapshot but lists no snapshot for is nobody's to see.
        return match template.kind.as_deref() {
            Some("snapshot") => SnapshotOwner::Someone,
            _ => SnapshotOwner::NotASnapshot,
        };
    }
    if matching.iter().all(|s| is_owned(s, prefix)) { SnapshotOwner::Caller } else { SnapshotOwner::Someone }
}

/// The `list_templates` tool's name (its function below must have this name: `tools::tests` checks).
pub const LIST_TEMPLATES: &str = "list_templates";

#[tool_router(router = template_router, vis = "pub(crate)")]
impl Gateway {
    #[tool(description = "List the templates create_sandbox can start a sandbox from: name (pass it as \
        create_sandbox's template; aliases and template_id work too), kind, size, creation time, python3 version, \
        and tasks: whether start_task works in it (its supervisor needs python3 3.8+).")]
    pub async fn list_templates(
        &self,
        Parameters(_args): Parameters<ListTemplatesArgs>,
        Extension(parts): Extension<Parts>,
    ) -> Result<Json<ListTemplatesResult>, String> {
        let call = self.call_context(LIST_TEMPLATES, &parts)?;
        self.logged(LIST_TEMPLATES, &call, self.list_templates_impl(&call)).await
    }
}

impl Gateway {
    async fn list_templates_impl(&self, call: &CallContext) -> Result<ListTemplatesResult, ToolError> {
        let templates =
            self.core.provider.list_templates().await.map_err(|err| ToolError::provider("list templates", err))?;
        // Snapshots are templates too: only the caller's are shown (as kind "snapshot").
        let snapshots = self.provider_snapshots(None, None).await?;
        let prefix = self.snapshot_prefix_of(call);
        let mut result = ListTemplatesResult {
            templates: templates
                .into_iter()
                .filter_map(|template| match snapshot_owner(&template, &snapshots, &prefix) {
                    SnapshotOwner::Someone => None,
                    SnapshotOwner::Caller => {
                        Some(TemplateSummary { kind: Some("snapshot".into()), ..summary(template) })
                    }
                    SnapshotOwner::NotASnapshot => Some(summary(template)),
                })
                .collect(),
            default_template: self.core.config.sandbox.default_template.clone(),
            truncated: false,
        };
        result.truncated = super::result_size::fit_list(&mut result, |r| &mut r.templates);
        Ok(result)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tasks_follow_the_python3_version_and_what_the_provider_says() {
        let local = |python3: Option<&str>| wire::Template {
            template_id: "id1".into(),
            names: vec!["deb".into()],
            aliases: vec!["deb".into(), "debian".into()],
            kind: Some("stored".into()),
            python3: python3.map(str::to_owned),
            ..Default::default()
        };
        let s = summary(local(Some("3.11")));
        assert_eq!((s.name.as_str(), s.aliases.clone(), s.tasks), ("deb", vec!["debian".to_owned()], Some(true)));
        assert_eq!(summary(local(Some("3.7"))).tasks, Some(false));
        assert_eq!(summary(local(None)).tasks, Some(false));
        assert_eq!(summary(local(Some("3"))).tasks, None);
        let e2b = wire::Template { template_id: "abc".into(), ..Default::default() };
        let s = summary(e2b);
        assert_eq!((s.name.as_str(), s.tasks), ("abc", None));
        assert!(runs_supervisor("3.8") && runs_supervisor("3.12") && !runs_supervisor("3.7") && !runs_supervisor("3"));
    }

    #[test]
    fn other_tenants_snapshots_are_left_out() {
        use crate::gateway::tools::snapshot::snapshot_prefix;
        let (mine, theirs) = (snapshot_prefix("default", "alice"), snapshot_prefix("default", "bob"));
        let snapshot =
            |name: &str| wire::SnapshotInfo { snapshot_id: format!("{name}:default"), names: vec![name.into()] };
        let snapshots = [snapshot(&format!("{mine}a")), snapshot(&format!("{theirs}b")), snapshot("plain")];
        let template = |id: &str, names: &[&str]| wire::Template {
            template_id: id.into(),
            names: names.iter().map(|n| (*n).to_owned()).collect(),
            ..Default::default()
        };
        let owner = |t: &wire::Template| snapshot_owner(t, &snapshots, &mine);
        assert_eq!(owner(&template("base", &["base"])), SnapshotOwner::NotASnapshot);
        assert_eq!(owner(&template(&format!("{mine}a:default"), &[])), SnapshotOwner::Caller);
        assert_eq!(owner(&template("id7", &[&format!("{mine}a")])), SnapshotOwner::Caller);
        assert_eq!(owner(&template(&format!("{theirs}b:default"), &[])), SnapshotOwner::Someone);
        // A snapshot made outside the gateway (no prefix) is nobody's here.
        assert_eq!(owner(&template("plain:default", &["plain"])), SnapshotOwner::Someone);
        // Another tenant's prefix is enough, even when the snapshot list does not have it.
        assert_eq!(owner(&template("x", &[&format!("{theirs}gone")])), SnapshotOwner::Someone);
        // A snapshot by the provider's word, of no snapshot listed: left out.
        let orphan = wire::Template { kind: Some("snapshot".into()), ..template("y", &["y"]) };
        assert_eq!(owner(&orphan), SnapshotOwner::Someone);
    }
}
