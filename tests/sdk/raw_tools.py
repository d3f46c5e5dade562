"""A stdio MCP tool server that keeps the bytes it is sent and declares
tool fields rmcp's model does not know.

Python's standard library only, one JSON-RPC message per line, so that
nothing between leasegate and this file re-reads a number: every
`tools/call` line is appended as received to `<state dir>/calls.jsonl`,
and the call answers with that line as its text content.

Tools, one per `tools/list` page (so that pagination is followed):

* `echo`: read-only (`readOnlyHint`);
* `record`: side-effecting, with `execution: {"taskSupport": "optional"}`
  (MCP 2025-11-25) and a vendor field `x-vendor` no version of MCP has.

Usage: raw_tools.py STATE_DIR
"""

import json
import os
import sys

STATE = sys.argv[1]

TOOLS = [
    {
        "name": "echo",
        "title": "Echo",
        "description": "Answers with the request line as received.",
        "inputSchema": {"type": "object"},
        "annotations": {"readOnlyHint": True},
    },
    {
        "name": "record",
        "description": "Records the request line as received.",
        "inputSchema": {"type": "object", "properties": {"n": {"type": "number"}}},
        "annotations": {"readOnlyHint": False, "destructiveHint": False},
        "execution": {"taskSupport": "optional"},
        "x-vendor": {"tier": "gold", "limits": [1, 2.5, None], "nested": {"ok": True}},
        "_meta": {"example.dev/owner": "raw-tools"},
    },
]


def send(message):
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


def answer(message, line):
    method = message.get("method")
    if method == "initialize":
        return {
            "protocolVersion": message["params"].get("protocolVersion", "2025-11-25"),
            "capabilities": {"tools": {}},
            "serverInfo": {"name": "raw-tools", "version": "1"},
        }
    if method == "ping":
        return {}
    if method == "tools/list":
        index = int((message.get("params") or {}).get("cursor") or 0)
        page = {"tools": TOOLS[index : index + 1]}
        if index + 1 < len(TOOLS):
            page["nextCursor"] = str(index + 1)
        return page
    if method == "tools/call":
        with open(os.path.join(STATE, "calls.jsonl"), "a") as calls:
            calls.write(line + "\n")
        return {"content": [{"type": "text", "text": line}]}
    return None


def main():
    os.makedirs(STATE, exist_ok=True)
    for line in sys.stdin:
        line = line.rstrip("\n")
        if not line.strip():
            continue
        message = json.loads(line)
        if "id" not in message or "method" not in message:
            continue
        result = answer(message, line)
        if result is None:
            send({"jsonrpc": "2.0", "id": message["id"],
                  "error": {"code": -32601, "message": "method not found"}})
        else:
            send({"jsonrpc": "2.0", "id": message["id"], "result": result})


if __name__ == "__main__":
    main()
