"""A stdio MCP tool server that keeps the bytes it is sent and declares
tool fields rmcp's model does not know.

Python's standard library only, one JSON-RPC message per line, so that
nothing between leasegate and this file re-reads a number: every
`tools/call` line is appended as received to `<state dir>/calls.jsonl`,
and the call answers with that line as its text content.

Tools, one per `tools/list` page (so that pagination is followed):

* `echo`: read-only (`readOnlyHint`), with a vendor field `x-vendor`;
* `record`: side-effecting, with `execution: {"taskSupport": "optional"}`
  (MCP 2025-11-25) and a vendor field `x-vendor` no version of MCP has.

With `--http`, the same over Streamable HTTP on an ephemeral port of
127.0.0.1 (printed as `raw tools at http://127.0.0.1:PORT/mcp`): one
session, no GET stream, each answer as JSON except `tools/list` pages
after the first, which come as an event stream (so that both of the ways
an HTTP server may answer carry the tool objects).

With `--ask-roots` (stdio), it asks its client `roots/list` as soon as
the session is initialized, as servers that want roots at start do, and
appends the answer as received to `<state dir>/replies.jsonl`.

Usage: raw_tools.py STATE_DIR [--http] [--ask-roots]
"""

import http.server
import json
import os
import sys

STATE = sys.argv[1]
SESSION = "raw-session-1"

TOOLS = [
    {
        "name": "echo",
        "title": "Echo",
        "description": "Answers with the request line as received.",
        "inputSchema": {"type": "object"},
        "annotations": {"readOnlyHint": True},
        "x-vendor": {"tier": "free"},
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


class Http(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        line = self.rfile.read(int(self.headers.get("content-length", 0))).decode()
        message = json.loads(line)
        if "id" not in message or "method" not in message:
            self.send_response(202)
            self.end_headers()
            return
        result = answer(message, line)
        if result is None:
            reply = {"jsonrpc": "2.0", "id": message["id"],
                     "error": {"code": -32601, "message": "method not found"}}
        else:
            reply = {"jsonrpc": "2.0", "id": message["id"], "result": result}
        cursor = (message.get("params") or {}).get("cursor")
        if message["method"] == "tools/list" and cursor:
            body = ("event: message\ndata: " + json.dumps(reply) + "\n\n").encode()
            kind = "text/event-stream"
        else:
            body = json.dumps(reply).encode()
            kind = "application/json"
        self.send_response(200)
        self.send_header("content-type", kind)
        self.send_header("content-length", str(len(body)))
        self.send_header("mcp-session-id", SESSION)
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        self.send_response(405)
        self.send_header("content-length", "0")
        self.end_headers()

    def do_DELETE(self):
        self.send_response(200)
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


def serve_http():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Http)
    print(f"raw tools at http://127.0.0.1:{server.server_address[1]}/mcp", flush=True)
    server.serve_forever()


def main():
    os.makedirs(STATE, exist_ok=True)
    if "--http" in sys.argv[2:]:
        serve_http()
        return
    for line in sys.stdin:
        line = line.rstrip("\n")
        if not line.strip():
            continue
        message = json.loads(line)
        if message.get("method") == "notifications/initialized" and "--ask-roots" in sys.argv[2:]:
            send({"jsonrpc": "2.0", "id": "roots-1", "method": "roots/list"})
            continue
        if "id" in message and "method" not in message:
            with open(os.path.join(STATE, "replies.jsonl"), "a") as replies:
                replies.write(line + "\n")
            continue
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
