"""The official Python SDK against leasegate (in front of server-everything and
the example mailer) where one agent's trouble used to reach another: a
cancelled call and the relay of another agent's sampling, a refusal that names
the calls it could belong to, bodies the front cannot read (too large, too
deep, a number out of range), logs for a handshake-era client on the stateless
front, and a cancel whose request id an earlier client used.

Run by tests/external/sdk_transparency.rs; prints one JSON line per check
({"check": name, "ok": bool, "detail": ...}) and exits 0 when all passed.

usage: relay.py --server URL|stdio [--stdio-command JSON] --front stateless|sessions|stdio
       --mode auto|legacy
       --run-id ID --owner O --epoch N --mailer-state DIR --tag TAG
       (the lease token in LEASEGATE_LEASE_TOKEN)
"""

import argparse
import contextlib
import json
import os
import sys
import time
import traceback
import warnings

import anyio
import httpx2
import mcp_types as types
from mcp import Client, StdioServerParameters

import late_answers
import report as report_module
from report import report

warnings.simplefilter("ignore")

parser = argparse.ArgumentParser()
parser.add_argument("--server", required=True)
parser.add_argument("--front", choices=["stateless", "sessions", "stdio"], required=True)
parser.add_argument("--stdio-command", default="[]")
parser.add_argument("--mode", default="auto")
parser.add_argument("--run-id", required=True)
parser.add_argument("--owner", required=True)
parser.add_argument("--epoch", type=int, required=True)
parser.add_argument("--mailer-state", required=True)
parser.add_argument("--tag", default="t")
args = parser.parse_args()

DEADLINE = 30.0
LEASE = {"dev.leasegate/lease": {"run_id": args.run_id, "owner": args.owner, "epoch": args.epoch,
                                 "token": os.environ.get("LEASEGATE_LEASE_TOKEN")}}


def tool(name):
    return f"everything__{name}"


async def on_sampling(ctx, params):
    return types.CreateMessageResult(
        role="assistant", content=types.TextContent(type="text", text="sampled by the agent"), model="agent-model"
    )


def text_of(result):
    return " ".join(getattr(c, "text", "") for c in result.content)


async def wait_for(what, probe, deadline=DEADLINE):
    end = time.monotonic() + deadline
    while time.monotonic() < end:
        value = await probe()
        if value:
            return value
        await anyio.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


async def check(name, body):
    try:
        report(name, True, await body())
    except Exception as error:  # noqa: BLE001 - every failure is reported, not raised
        report(name, False, f"{type(error).__name__}: {error}\n{traceback.format_exc()[-1500:]}")


def server():
    if args.front == "stdio":
        command = json.loads(args.stdio_command)
        return StdioServerParameters(command=command[0], args=command[1:], env={"RUST_LOG": "warn"})
    return args.server


def client(**kwargs):
    return Client(server(), mode=args.mode, sampling_callback=on_sampling, **kwargs)


async def sampled_by(agent, attempts):
    """Calls a tool that asks the agent for sampling until it is relayed
    (each refusal is kept); a refusal that lasts fails the check."""
    async def sampled():
        result = await agent.call_tool(tool("trigger-sampling-request"), {"prompt": "hi", "maxTokens": 5})
        attempts.append(text_of(result)[:200])
        return "sampled by the agent" in text_of(result)
    await wait_for("the sampling to be relayed", sampled, deadline=20.0)


async def cancelled_call_then_another_agents_sampling():
    # One agent starts a long call to the stdio upstream and cancels it once
    # it runs (its progress arrived); the upstream never answers it.
    own = []
    async with client() as first:
        running = anyio.Event()

        async def on_progress(value, total, message):
            running.set()

        scope = anyio.CancelScope()

        async def long_call():
            with scope:
                await first.call_tool(tool("trigger-long-running-operation"), {"duration": 40, "steps": 40},
                                      progress_callback=on_progress)
                raise AssertionError("the cancelled call delivered a result")

        async with anyio.create_task_group() as group:
            group.start_soon(long_call)
            with anyio.fail_after(DEADLINE):
                await running.wait()
            scope.cancel()
        # Its own next call whose tool asks it for sampling is relayed well
        # within the minute the cancelled call used to block the upstream.
        await sampled_by(first, own)
    if args.front == "stdio":
        # Another agent has its own `leasegate stdio` and upstream.
        return {"own_attempts": len(own), "own_refusals": own[:-1]}
    # So is another agent's.
    others = []
    async with client() as other:
        await sampled_by(other, others)
    return {"own_attempts": len(own), "own_refusals": own[:-1],
            "other_attempts": len(others), "other_refusals": others[:-1]}


async def refusal_names_the_candidates():
    # Two calls in flight to a stdio upstream (of two agents; over the stdio
    # front, where each agent has its own process, of one): its sampling
    # request cannot be attributed, and the refusal says which calls it
    # could belong to.
    async with contextlib.AsyncExitStack() as stack:
        first = await stack.enter_async_context(client())
        second = first if args.front == "stdio" else await stack.enter_async_context(client())
        running = anyio.Event()
        texts = []

        async def on_progress(value, total, message):
            running.set()

        async def long_call():
            await first.call_tool(tool("trigger-long-running-operation"), {"duration": 4, "steps": 8},
                                  progress_callback=on_progress)

        async with anyio.create_task_group() as group:
            group.start_soon(long_call)
            with anyio.fail_after(DEADLINE):
                await running.wait()
            result = await second.call_tool(tool("trigger-sampling-request"), {"prompt": "hi", "maxTokens": 5})
            texts.append(text_of(result))
        text = texts[0]
        assert result.is_error and "sampled by the agent" not in text, text[:400]
        for named in ("calls are in flight", "tools/call trigger-long-running-operation",
                      "tools/call trigger-sampling-request", "request "):
            assert named in text, (named, text[:600])
        return text[:400]


async def oversized_then_normal_calls():
    # An 8 MiB call (the limit is 4 MiB plus the envelope) is refused with a
    # JSON-RPC error naming the limit; the same session goes on.
    async with client() as agent:
        refusals = []
        for _ in range(3):
            try:
                await agent.call_tool(tool("get-sum"), {"a": 1, "b": 2, "pad": "x" * (8 * 1024 * 1024)})
                raise AssertionError("an 8 MiB call was accepted")
            except AssertionError:
                raise
            except Exception as error:  # noqa: BLE001
                assert getattr(error, "code", None) == -32600, repr(error)[:300]
                assert "max_arguments_bytes" in str(error) and "limit" in str(error), str(error)[:300]
                refusals.append(str(error)[:200])
            result = await agent.call_tool(tool("get-sum"), {"a": 20, "b": 22})
            assert "42" in text_of(result) and not result.is_error, text_of(result)
        return refusals[0]


def rpc_answer(response):
    """The JSON-RPC message of an HTTP answer, JSON or an event stream."""
    if response.headers.get("content-type", "").startswith("text/event-stream"):
        for line in response.text.splitlines():
            if line.startswith("data:") and line[5:].strip():
                message = json.loads(line[5:])
                if "id" in message:
                    return message
        raise AssertionError(f"no answer in the stream: {response.text[:300]}")
    return response.json()


async def unreadable_bodies_answered_under_their_id():
    headers = {"accept": "application/json, text/event-stream", "content-type": "application/json",
               "mcp-protocol-version": "2025-11-25"}
    seen = {}
    async with httpx2.AsyncClient(timeout=DEADLINE) as http:
        if args.front == "sessions":
            init = await http.post(args.server, headers=headers, json={
                "jsonrpc": "2.0", "id": 0, "method": "initialize",
                "params": {"protocolVersion": "2025-11-25", "capabilities": {},
                           "clientInfo": {"name": "raw", "version": "1"}}})
            assert init.status_code == 200, init.text[:300]
            headers["mcp-session-id"] = init.headers["mcp-session-id"]
            await http.post(args.server, headers=headers,
                            json={"jsonrpc": "2.0", "method": "notifications/initialized"})
        deep = ('{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"everything__get-sum",'
                '"arguments":{"a":' + "[" * 200 + "1" + "]" * 200 + ',"b":1}}}')
        huge = ('{"jsonrpc":"2.0","id":"big-1","method":"tools/call","params":{"name":"everything__get-sum",'
                '"arguments":{"a":1e400,"b":1}}}')
        for name, body, wanted_id in [("deep", deep, 7), ("1e400", huge, "big-1")]:
            response = await http.post(args.server, headers=headers, content=body.encode())
            answer = rpc_answer(response)
            assert answer.get("id") == wanted_id, answer
            assert answer["error"]["code"] == -32700, answer
            assert "128 levels" in answer["error"]["message"], answer
            seen[name] = answer["error"]["message"][:160]
        # The session (if any) goes on.
        ping = await http.post(args.server, headers=headers, json={"jsonrpc": "2.0", "id": 8, "method": "ping"})
        answer = rpc_answer(ping)
        assert answer.get("id") == 8 and "result" in answer, answer
    return seen


async def handshake_era_stateless_logs():
    logs = []

    async def on_log(params):
        logs.append(params)

    async with Client(args.server, mode="legacy", logging_callback=on_log) as agent:
        await agent.set_logging_level("debug")
        await agent.call_tool(tool("toggle-simulated-logging"), {})
        try:
            # server-everything logs every 5 s: a 6 s call sees at least one.
            async def logged():
                await agent.call_tool(tool("trigger-long-running-operation"), {"duration": 6, "steps": 2})
                return list(logs)
            entries = await wait_for("a log message within a call", logged, deadline=40.0)
        finally:
            await agent.call_tool(tool("toggle-simulated-logging"), {})
    loggers = {entry.logger for entry in entries}
    assert all(lg and lg.startswith("everything") for lg in loggers), loggers
    return {"logs": len(entries), "loggers": sorted(loggers)}


async def cancel_of_a_reused_request_id():
    # Two short sessions of one client identity (same headers): the second
    # reuses the first's request ids, and its cancel still reaches the tool.
    to = f"reuse-{args.tag}@example.com"
    state = args.mailer_state

    def lines(name):
        try:
            with open(os.path.join(state, name)) as f:
                return [line for line in f if to in line]
        except FileNotFoundError:
            return []

    async with Client(args.server, mode="legacy") as first:
        await first.call_tool(tool("get-sum"), {"a": 1, "b": 2})
    async with Client(args.server, mode="legacy") as second:
        answered_before = late_answers.cancelled_answers()
        scope = anyio.CancelScope()

        async def call():
            with scope:
                await second.call_tool("mailer__send_email", {"to": to, "hang_ms": 20000}, meta=LEASE)
                raise AssertionError("the cancelled call delivered a result")

        async with anyio.create_task_group() as group:
            group.start_soon(call)
            await wait_for("the email to reach the tool", lambda: anyio.to_thread.run_sync(lines, "emails.jsonl"))
            scope.cancel()

        def cancelled():
            return any('"cancelled":true' in line.replace(" ", "") for line in lines("calls.jsonl"))

        await wait_for("the cancel to reach the tool", lambda: anyio.to_thread.run_sync(cancelled), deadline=15.0)
        # leasegate answers the cancelled call at once; close only after
        # that answer arrived (see late_answers).
        async def answered():
            return late_answers.cancelled_answers() > answered_before

        await wait_for("leasegate's -32800 to the cancelled call", answered)
    return {"cancelled": to}


async def main():
    await check("cancelled_call_then_another_agents_sampling", cancelled_call_then_another_agents_sampling)
    await check("refusal_names_the_candidates", refusal_names_the_candidates)
    if args.front == "stdio":
        return
    await check("oversized_then_normal_calls", oversized_then_normal_calls)
    await check("unreadable_bodies_answered_under_their_id", unreadable_bodies_answered_under_their_id)
    if args.front == "stateless":
        await check("handshake_era_stateless_logs", handshake_era_stateless_logs)
        await check("cancel_of_a_reused_request_id", cancel_of_a_reused_request_id)


try:
    anyio.run(main)
except Exception as error:  # noqa: BLE001
    report("session", False, f"{type(error).__name__}: {error}\n{traceback.format_exc()[-2000:]}")
sys.exit(1 if report_module.failures else 0)
