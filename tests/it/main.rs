//! The integration tests, in one test binary (one link instead of one per file): each module
//! is one area, run against the real local provider and gateway with real clients. The support
//! modules (`common`, `harness`, `oci`, `registry`, `tasks_support`) are shared by all of them.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code fails loudly

mod common;
mod harness;
mod oci;
mod registry;
mod tasks_support;

mod abuse;
mod e2b_sdk_interop;
mod envd_agent;
mod gateway_http;
mod gateway_legacy_json;
mod gateway_lifecycle;
mod gateway_metrics;
mod gateway_modern;
mod gateway_oauth;
mod gateway_python_interop;
mod gateway_python_v2_interop;
mod gateway_redis_sessions;
mod gateway_refusal_interop;
mod gateway_shutdown;
mod gateway_tools;
mod gateway_ts_interop;
mod host_secrets;
mod inbound_traffic;
mod lean_agent;
mod local_provider;
mod oci_gateway;
mod oci_registry;
mod oci_templates;
mod provider_client;
mod readme_clients;
mod sandbox_host_addresses;
mod sandbox_network;
mod sandbox_privileges;
mod snapshot_sdks;
mod snapshot_tasks;
mod snapshots;
mod tasks_lifecycle;
mod tasks_output;
mod tasks_reconnect;
mod template_build_attacks;
mod template_builds;
mod tenant_fairness;
