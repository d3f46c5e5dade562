#!/usr/bin/env python3
"""An example agent in Python: holds its lease over leasegate's control API
(plain HTTP, heartbeat in a thread), plans its steps as intents in the same
protected transaction as its checkpoint, and calls tools through leasegate
with the official MCP Python SDK. Run twice on the same run id and the second
process takes over and resumes the same plan: the same operation ids, no
second side effect.

    python3 agent.py --control http://127.0.0.1:8641 --mcp http://127.0.0.1:8640/mcp \
        --tenant quickstart --task order-42

Prints one JSON line per thing it did. Exit codes: 0 done, 3 crashed on
purpose (--crash-after-plan), 4 lease lost, 1 other errors.
"""

import argparse
import asyncio
import json
import os
import sys
import threading
import urllib.error
import urllib.request

from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client

PLAN = [
    {"tool": "payments__charge", "arguments": {"amount": 1200, "currency": "eur"}, "step_id": "charge-customer"},
    {"tool": "mailer__send_email", "arguments": {"to": "customer@example.com", "subject": "receipt"},
     "step_id": "send-receipt"},
]


def emit(event, **fields):
    print(json.dumps({"event": event, **fields}), flush=True)


class ControlError(Exception):
    def __init__(self, status, body):
        super().__init__(f"{status} {body.get('code')}: {body.get('message')}")
        self.status = status
        self.code = body.get("code")


class Control:
    """The control API, with nothing but the standard library."""

    def __init__(self, base):
        self.base = base.rstrip("/")

    def call(self, method, path, body=None):
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.base + path, data=data, method=method,
                                         headers={"content-type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                return json.loads(response.read())
        except urllib.error.HTTPError as error:
            raise ControlError(error.code, json.loads(error.read() or b"{}")) from None


class Heartbeat(threading.Thread):
    """Renews every ttl/3; the first renewal it cannot confirm sets `lost`."""

    def __init__(self, control, run_id, owner, epoch, token, ttl_ms):
        super().__init__(daemon=True)
        self.control, self.run_id, self.owner, self.epoch, self.ttl_ms = control, run_id, owner, epoch, ttl_ms
        self.token = token
        self.lost = threading.Event()
        self.stopped = threading.Event()

    def run(self):
        while not self.stopped.wait(self.ttl_ms / 3000):
            try:
                self.control.call("POST", f"/v1/runs/{self.run_id}/lease/renew",
                                  {"owner": self.owner, "epoch": self.epoch, "lease_token": self.token,
                                   "ttl_ms": self.ttl_ms})
            except Exception as error:  # lease lost, run terminal, or no answer: stop
                emit("lease_lost", cause=str(error))
                self.lost.set()
                return


async def call_tool(mcp_url, lease, step):
    meta = {"dev.leasegate/lease": lease,
            "dev.leasegate/step": {"step_id": step["step_id"], "effect_version": 1}}
    async with streamable_http_client(mcp_url) as (read, write, *_):
        async with ClientSession(read, write) as session:
            await session.initialize()
            result = await session.call_tool(step["tool"], step["arguments"], meta=meta)
            dumped = result.model_dump(by_alias=True, exclude_none=True)
            return dumped


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--control", required=True)
    parser.add_argument("--mcp", required=True)
    parser.add_argument("--tenant", default="default")
    parser.add_argument("--task", required=True)
    parser.add_argument("--run-id")
    parser.add_argument("--ttl-ms", type=int, default=30000)
    parser.add_argument("--crash-after-plan", action="store_true")
    args = parser.parse_args()
    control = Control(args.control)

    run_id = args.run_id
    if run_id is None:
        run_id = control.call("POST", "/v1/runs", {"tenant_id": args.tenant, "task_id": args.task})["run_id"]
        emit("run_created", run_id=run_id)
    grant = control.call("POST", f"/v1/runs/{run_id}/lease", {"ttl_ms": args.ttl_ms})
    owner, epoch, revision = grant["owner"], grant["epoch"], grant["revision"]
    # The lease's secret, shown once: every lease-fenced write sends it (never log it).
    token = grant["lease_token"]
    emit("acquired", run_id=run_id, owner=owner, epoch=epoch, took_over=grant["took_over"])
    heartbeat = Heartbeat(control, run_id, owner, epoch, token, args.ttl_ms)
    heartbeat.start()

    if grant["run_status"] == "pending":
        revision = control.call("POST", f"/v1/runs/{run_id}/start",
                                {"owner": owner, "epoch": epoch, "lease_token": token,
                                 "expected_revision": revision})["revision"]
    checkpoint = control.call("GET", f"/v1/runs/{run_id}")["checkpoint"]
    if "plan" in checkpoint:
        plan, done = checkpoint["plan"], checkpoint.get("done", [])
        emit("resumed", plan=[s["step_id"] for s in plan], done=done)
    else:
        plan, done = PLAN, []
        saved = control.call("POST", f"/v1/runs/{run_id}/checkpoint", {
            "owner": owner, "epoch": epoch, "lease_token": token, "expected_revision": revision,
            "checkpoint": {"plan": plan, "done": done}, "intents": plan})
        revision = saved["revision"]
        emit("planned", operations={i["step_id"]: i["operation_id"] for i in saved["intents"]})
    if args.crash_after_plan:
        emit("crashing")
        os._exit(3)

    lease = {"run_id": run_id, "owner": owner, "epoch": epoch, "token": token}
    for step in plan:
        if step["step_id"] in done:
            continue
        if heartbeat.lost.is_set():
            return 4
        result = asyncio.run(call_tool(args.mcp, lease, step))
        note = result.get("_meta", {}).get("dev.leasegate/operation", {})
        emit("called", step_id=step["step_id"], operation=note, is_error=result.get("isError", False))
        done.append(step["step_id"])
        revision = control.call("POST", f"/v1/runs/{run_id}/checkpoint", {
            "owner": owner, "epoch": epoch, "lease_token": token, "expected_revision": revision,
            "checkpoint": {"plan": plan, "done": done}})["revision"]

    control.call("POST", f"/v1/runs/{run_id}/complete",
                 {"owner": owner, "epoch": epoch, "lease_token": token, "expected_revision": revision})
    heartbeat.stopped.set()
    control.call("POST", f"/v1/runs/{run_id}/lease/release", {"owner": owner, "epoch": epoch, "lease_token": token})
    emit("completed", run_id=run_id)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except ControlError as error:
        emit("error", message=str(error), code=error.code)
        sys.exit(4 if error.code == "lease_lost" else 1)
