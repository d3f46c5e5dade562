"""The official Python SDK (default client, mcp 2.3.0) through leasegate's
HTTP front with `[auth] mode = "required"`.

Run by tests/integration/auth.rs; prints one JSON line per check
({"check": name, "ok": bool, "detail": ...}) and exits 0 when every check
passed. With an `Authorization: Bearer` header on the SDK's own HTTP client
(`streamable_http_client(url, http_client=httpx2.AsyncClient(headers=...))`)
it lists the tools and makes a gated call under the lease given in the
environment; the default client without the header is refused, every
request answered 401 with a `WWW-Authenticate` challenge.

usage: bearer.py URL   (LEASEGATE_BEARER, LEASEGATE_RUN_ID, LEASEGATE_OWNER,
                        LEASEGATE_EPOCH, LEASEGATE_LEASE_TOKEN in the environment)
"""

import json
import os
import sys
import traceback
import warnings

import anyio
import httpx2
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

# The checks' JSON lines and failure count, shared with the other SDK script.
import report as report_module
from report import report

warnings.simplefilter("ignore")

URL = sys.argv[1]
LEASE = {
    "dev.leasegate/lease": {
        "run_id": os.environ["LEASEGATE_RUN_ID"],
        "owner": os.environ["LEASEGATE_OWNER"],
        "epoch": int(os.environ["LEASEGATE_EPOCH"]),
        "token": os.environ["LEASEGATE_LEASE_TOKEN"],
    }
}
def described(error):
    """An exception (group) and its causes as text."""
    return "".join(traceback.format_exception(error))[-3000:]


async def main():
    headers = {"Authorization": f"Bearer {os.environ['LEASEGATE_BEARER']}"}
    try:
        transport = streamable_http_client(URL, http_client=httpx2.AsyncClient(headers=headers))
        async with Client(transport) as client:
            names = sorted(t.name for t in (await client.list_tools()).tools)
            report("lists tools with the bearer token", "payments__charge" in names, names)
            result = await client.call_tool(
                "payments__charge", {"amount": 11, "currency": "eur"}, meta=LEASE
            )
            detail = result.model_dump(by_alias=True, exclude_none=True, mode="json")
            report("a gated call with the bearer token and the lease token", not result.is_error, detail)
    except BaseException as error:  # noqa: BLE001 - reported, not raised
        report("connects with the bearer token", False, described(error))

    # The SDK turns a non-2xx answer without a JSON-RPC body into a
    # stand-in error, so the status is watched on its HTTP client too.
    try:
        async with Client(URL) as client:
            await client.list_tools()
        report("the default client without a token is refused", False, "it connected")
    except BaseException as error:  # noqa: BLE001 - the refusal is the expected outcome
        text = described(error)
        report("the default client without a token is refused", "MCPError" in text, text)
    answers = []

    async def record(response):
        answers.append((response.status_code, response.headers.get("www-authenticate")))

    try:
        transport = streamable_http_client(
            URL, http_client=httpx2.AsyncClient(event_hooks={"response": [record]})
        )
        async with Client(transport) as client:
            await client.list_tools()
        report("without a token every request is answered 401", False, answers)
    except BaseException:  # noqa: BLE001 - the refusal is the expected outcome
        ok = bool(answers) and all(
            status == 401 and challenge and "resource_metadata=" in challenge
            for status, challenge in answers
        )
        report("without a token every request is answered 401", ok, answers)


anyio.run(main)
sys.exit(1 if report_module.failures else 0)
