//! Client for any E2B-compatible provider (E2B cloud, self-hosted E2B, or the
//! embedded local provider): control plane, envd Connect RPCs and files.

pub mod wire;
