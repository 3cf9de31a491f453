//! OCI and Docker image documents: indexes (resolved to the host's
//! platform), manifests (OCI and Docker v2 schema 2), image configs, and the
//! layer stream's compression (gzip, zstd or none, told by its magic bytes).

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read};

use serde::Deserialize;

use super::StoreError;
use super::digest::Digest;
use super::layout::RunConfig;

pub const OCI_INDEX: &str = "application/vnd.oci.image.index.v1+json";
pub const DOCKER_LIST: &str = "application/vnd.docker.distribution.manifest.list.v2+json";
/// Largest manifest, index or config accepted.
pub const MAX_DOCUMENT: u64 = 4 << 20;

/// A content descriptor.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Descriptor {
    #[serde(default)]
    pub media_type: String,
    pub digest: String,
    #[serde(default)]
    pub size: u64,
    #[serde(default)]
    pub platform: Option<Platform>,
    #[serde(default)]
    pub annotations: BTreeMap<String, String>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct Platform {
    #[serde(default)]
    pub architecture: String,
    #[serde(default)]
    pub os: String,
}

/// An index, or a manifest: both parse as this (fields absent in the other stay empty).
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Document {
    #[serde(default)]
    pub media_type: String,
    #[serde(default)]
    pub manifests: Vec<Descriptor>,
    #[serde(default)]
    pub config: Option<Descriptor>,
    #[serde(default)]
    pub layers: Vec<Descriptor>,
}

impl Document {
    pub fn parse(bytes: &[u8]) -> Result<Document, StoreError> {
        serde_json::from_slice(bytes).map_err(|e| StoreError::BadImage(format!("not an image manifest or index: {e}")))
    }

    /// Whether this is an index (a list of manifests), told by media type or shape.
    pub fn is_index(&self) -> bool {
        self.media_type == OCI_INDEX
            || self.media_type == DOCKER_LIST
            || (self.config.is_none() && !self.manifests.is_empty())
    }
}

/// The host's platform as OCI names it (`linux`/`amd64`, `linux`/`arm64`, ...).
pub fn host_platform() -> (&'static str, &'static str) {
    let arch = match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        "x86" => "386",
        "powerpc64" => "ppc64le",
        other => other,
    };
    ("linux", arch)
}

/// The manifest of an index for the host's platform (entries without a platform count as a match
/// only when there is no better one; attestation manifests are skipped).
pub fn pick_manifest(index: &Document) -> Result<&Descriptor, StoreError> {
    let (os, arch) = host_platform();
    let usable =
        |d: &&Descriptor| d.annotations.get("vnd.docker.reference.type").is_none_or(|t| t != "attestation-manifest");
    let exact = index
        .manifests
        .iter()
        .filter(usable)
        .find(|d| d.platform.as_ref().is_some_and(|p| p.os == os && p.architecture == arch));
    let any = || index.manifests.iter().filter(usable).find(|d| d.platform.is_none());
    exact.or_else(any).ok_or_else(|| {
        let offered: Vec<String> = index
            .manifests
            .iter()
            .filter_map(|d| d.platform.as_ref().map(|p| format!("{}/{}", p.os, p.architecture)))
            .collect();
        StoreError::BadImage(format!("the image has no {os}/{arch} variant (it has: {})", offered.join(", ")))
    })
}

/// The parts of an image config the store keeps.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct ImageConfig {
    pub architecture: String,
    pub os: String,
    pub config: ContainerConfig,
    pub rootfs: RootFs,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
pub struct ContainerConfig {
    pub env: Option<Vec<String>>,
    pub working_dir: Option<String>,
    pub user: Option<String>,
    pub entrypoint: Option<Vec<String>>,
    pub cmd: Option<Vec<String>>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct RootFs {
    pub diff_ids: Vec<String>,
}

impl ImageConfig {
    pub fn parse(bytes: &[u8]) -> Result<ImageConfig, StoreError> {
        serde_json::from_slice(bytes).map_err(|e| StoreError::BadImage(format!("bad image config: {e}")))
    }

    pub fn run_config(&self) -> RunConfig {
        let c = &self.config;
        RunConfig {
            env: c.env.clone().unwrap_or_default(),
            workdir: c.working_dir.clone().unwrap_or_default(),
            user: c.user.clone().unwrap_or_default(),
            entrypoint: c.entrypoint.clone().unwrap_or_default(),
            cmd: c.cmd.clone().unwrap_or_default(),
            start_cmd: None,
            ready_cmd: None,
        }
    }

    /// The uncompressed digest of layer `i`, when the config names a valid one.
    pub fn diff_id(&self, i: usize) -> Option<Digest> {
        self.rootfs.diff_ids.get(i).and_then(|d| Digest::parse(d).ok())
    }
}

/// Wraps a layer blob in the decompressor its first bytes call for.
pub fn decompress<'a>(raw: impl Read + 'a) -> Result<Box<dyn Read + 'a>, StoreError> {
    let mut buffered = BufReader::with_capacity(256 * 1024, raw);
    let head = buffered.fill_buf().map_err(|e| StoreError::Extract(format!("reading a layer: {e}")))?;
    if head.starts_with(&[0x1f, 0x8b]) {
        Ok(Box::new(flate2::bufread::MultiGzDecoder::new(buffered)))
    } else if head.starts_with(&[0x28, 0xb5, 0x2f, 0xfd]) {
        let decoder = ruzstd::decoding::StreamingDecoder::new(buffered)
            .map_err(|e| StoreError::Extract(format!("bad zstd layer: {e}")))?;
        Ok(Box::new(decoder))
    } else {
        Ok(Box::new(buffered))
    }
}
