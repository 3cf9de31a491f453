"""The official Python MCP SDK's OAuth client, run headless against a gateway
protected by [auth.oauth] (driven by tests/it/gateway_oauth.rs).

Usage: mcp_oauth_client.py MCP_URL LOGIN

The SDK does the whole MCP authorization flow by itself: 401 from /mcp ->
protected resource metadata (WWW-Authenticate resource_metadata) ->
authorization server metadata -> dynamic client registration -> authorization
code + PKCE with the resource indicator -> token -> MCP. This script only plays
the user: its redirect handler follows the authorization URL, logs in as LOGIN
and consents at the test authorization server (tests/oauth/idp.mjs), and hands
the code back through the callback handler. Then it calls create_sandbox and
run_command. Prints one JSON line with what happened; exits non-zero on error.
"""

import asyncio
import json
import sys
from urllib.parse import parse_qs, urljoin, urlparse

import httpx
from mcp import ClientSession
from mcp.client.auth import OAuthClientProvider
from mcp.client.streamable_http import streamablehttp_client
from mcp.shared.auth import OAuthClientInformationFull, OAuthClientMetadata, OAuthToken
from pydantic import AnyUrl

REDIRECT_URI = "http://localhost:3999/callback"  # never listened on: the Location header is read instead


class MemoryStorage:
    def __init__(self):
        self.tokens = None
        self.client_info = None

    async def get_tokens(self) -> OAuthToken | None:
        return self.tokens

    async def set_tokens(self, tokens: OAuthToken) -> None:
        self.tokens = tokens

    async def get_client_info(self) -> OAuthClientInformationFull | None:
        return self.client_info

    async def set_client_info(self, client_info: OAuthClientInformationFull) -> None:
        self.client_info = client_info


class HeadlessUser:
    """Answers the authorization server's login and consent interaction."""

    def __init__(self, login: str):
        self.login = login
        self.result: asyncio.Future = asyncio.get_running_loop().create_future()
        self.steps: list[str] = []

    async def redirect_handler(self, authorization_url: str) -> None:
        async with httpx.AsyncClient(follow_redirects=False, timeout=20) as browser:
            url, method, data = authorization_url, "GET", None
            for _ in range(20):
                response = await browser.request(method, url, data=data)
                if response.is_redirect:
                    url, method, data = urljoin(url, response.headers["location"]), "GET", None
                    if url.startswith(REDIRECT_URI):
                        query = parse_qs(urlparse(url).query)
                        if "error" in query:
                            raise RuntimeError(f"authorization failed: {query}")
                        self.result.set_result((query["code"][0], query.get("state", [None])[0]))
                        return
                    continue
                response.raise_for_status()
                interaction = response.json()
                self.steps.append(interaction["prompt"])
                base = urlparse(url)._replace(query="").geturl()
                if interaction["prompt"] == "login":
                    url, method, data = f"{base}/login", "POST", {"login": self.login}
                elif interaction["prompt"] == "consent":
                    url, method, data = f"{base}/confirm", "POST", {}
                else:
                    raise RuntimeError(f"unexpected interaction {interaction}")
            raise RuntimeError("the authorization flow did not end at the redirect URI")

    async def callback_handler(self) -> tuple[str, str | None]:
        return await asyncio.wait_for(self.result, 30)


async def main(url: str, login: str) -> dict:
    user = HeadlessUser(login)
    storage = MemoryStorage()
    oauth = OAuthClientProvider(
        server_url=url,
        client_metadata=OAuthClientMetadata(
            client_name="sandbox-mcp oauth test",
            redirect_uris=[AnyUrl(REDIRECT_URI)],
            grant_types=["authorization_code", "refresh_token"],
            response_types=["code"],
            token_endpoint_auth_method="none",
        ),
        storage=storage,
        redirect_handler=user.redirect_handler,
        callback_handler=user.callback_handler,
    )
    report: dict = {}
    async with streamablehttp_client(url, auth=oauth) as (read, write, _):
        async with ClientSession(read, write) as session:
            await session.initialize()
            tools = await session.list_tools()
            report["tools"] = sorted(t.name for t in tools.tools)
            created = await session.call_tool("create_sandbox", {})
            if created.isError:
                raise RuntimeError(f"create_sandbox failed: {created.content}")
            report["sandbox_id"] = created.structuredContent["sandbox_id"]
            ran = await session.call_tool("run_command", {"command": "echo oauth-$((40+2))"})
            if ran.isError:
                raise RuntimeError(f"run_command failed: {ran.content}")
            report["stdout"] = ran.structuredContent["stdout"]
            listed = await session.call_tool("list_sandboxes", {})
            report["listed"] = [s["sandbox_id"] for s in listed.structuredContent["sandboxes"]]
    report["interaction"] = user.steps
    report["client_registered"] = storage.client_info is not None and bool(storage.client_info.client_id)
    report["token_type"] = storage.tokens.token_type if storage.tokens else None
    report["scope"] = storage.tokens.scope if storage.tokens else None
    return report


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: mcp_oauth_client.py MCP_URL LOGIN")
    print(json.dumps(asyncio.run(main(sys.argv[1], sys.argv[2]))))
