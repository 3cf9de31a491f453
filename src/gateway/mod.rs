//! The MCP gateway: axum app, auth, sessions and MCP tools.
