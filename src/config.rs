//! Typed configuration: TOML file plus environment overrides.
