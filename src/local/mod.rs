//! The embedded E2B-compatible local provider: control plane, per-sandbox
//! isolation, and the in-sandbox envd agent.
