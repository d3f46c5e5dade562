"""An agent whose model re-plans a call that timed out, on the official MCP
Python SDK in its default settings but for a 3 s read timeout (an agent
framework's per-call budget).

Against leasegate in lease mode `session` over Streamable HTTP (the task key
in `Leasegate-Task`) or over stdio (`leasegate stdio --task`), with the
example tools. Prints one JSON line per step: what the SDK returned or
raised. The test (tests/external/replanned_sdk.rs) counts the tool's effects
and judges.
"""

import argparse
import contextlib
import json
import sys

import anyio
import httpx2
from mcp import Client, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

parser = argparse.ArgumentParser()
parser.add_argument("--server", required=True, help="leasegate's /mcp URL, or 'stdio'")
parser.add_argument("--stdio-command", default="[]")
parser.add_argument("--task", required=True)
args = parser.parse_args()

READ_TIMEOUT = 3.0


def server():
    if args.server == "stdio":
        command = json.loads(args.stdio_command)
        return StdioServerParameters(command=command[0], args=command[1:], env={"RUST_LOG": "warn"})
    return with_task_header(args.server)


@contextlib.asynccontextmanager
async def with_task_header(url):
    async with httpx2.AsyncClient(headers={"Leasegate-Task": args.task}) as http:
        async with streamable_http_client(url, http_client=http) as streams:
            yield streams


def emit(step, **fields):
    print(json.dumps({"step": step, **fields}), flush=True)


async def outcome(client, tool, arguments):
    """What the agent's code sees of one call: the result, or the error."""
    try:
        result = await client.call_tool(tool, arguments)
    except MCPError as error:
        return {"error": {"code": error.error.code, "message": error.error.message}}
    except TimeoutError as error:
        return {"timed_out": str(error)}
    dumped = result.model_dump(mode="json", by_alias=True, exclude_none=True)
    return {"result": dumped}


async def main():
    async with Client(server(), read_timeout_seconds=READ_TIMEOUT) as client:
        tools = await client.list_tools()
        charge = next(t for t in tools.tools if t.name == "payments__charge")
        emit("charge_schema", properties=sorted(charge.input_schema.get("properties", {})))

        first = {"to": "ann@example.com", "subject": "Receipt", "body": "Your receipt.",
                 "hang_ms": 6000}
        # The tool sends, then hangs: the SDK gives up after 3 s.
        emit("first", **await outcome(client, "mailer__send_email", first))
        # The framework's plain retry: the same call.
        emit("identical", **await outcome(client, "mailer__send_email", first))
        # The model plans it again, in other words.
        replanned = {"to": "ann@example.com", "subject": "Your receipt",
                     "body": "Here is the receipt for your order."}
        emit("replanned", **await outcome(client, "mailer__send_email", replanned))
        emit("replanned_again", **await outcome(client, "mailer__send_email", replanned))

        # A connected agent's parallel calls to one tool are never held.
        answers = [None] * 16

        async def one(i):
            answers[i] = await outcome(client, "mailer__send_email",
                                       {"to": f"p{i}@example.com", "subject": "Hello"})
        async with anyio.create_task_group() as group:
            for i in range(16):
                group.start_soon(one, i)
        emit("parallel", answers=answers)


if __name__ == "__main__":
    try:
        anyio.run(main)
    except Exception as error:  # noqa: BLE001 - reported for the test to show
        emit("crashed", error=f"{type(error).__name__}: {error}")
        sys.exit(1)
