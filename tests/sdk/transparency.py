"""An unmodified MCP client (the official Python SDK, default settings) against
leasegate in front of @modelcontextprotocol/server-everything.

Run by tests/external/sdk_transparency.rs; prints one JSON line per check:
{"check": name, "ok": bool, "detail": ...}, and exits 0 when every check
passed. With `--lease explicit` (the default) the lease for side-effecting
calls comes in as arguments (the Rust test creates the run) and goes in each
gated call's `_meta`; with `--lease session` the client sends no lease at all
(leasegate's lease mode `session` holds the task's lease): over HTTP it names
its task in a `Leasegate-Task` header on its HTTP client, over stdio the task
is on leasegate's command line. Everything else is plain SDK usage.

usage: transparency.py --front stateless|sessions|stdio --server URL|stdio
       --stdio-command JSON --mode auto|legacy
       --upstream NAME [--lease explicit --run-id ID --owner O --epoch N]
       [--lease session --task KEY] --interactive yes|no
       --mailer-state DIR --tag TAG
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
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

import late_answers
# The checks' JSON lines and failure count, shared with the other SDK script.
import report as report_module
from report import report

warnings.simplefilter("ignore")

parser = argparse.ArgumentParser()
parser.add_argument("--server", required=True)
parser.add_argument("--front", choices=["stateless", "sessions", "stdio"], required=True)
parser.add_argument("--stdio-command", default="[]")
parser.add_argument("--mode", default="auto")
parser.add_argument("--upstream", default="everything")
parser.add_argument("--lease", choices=["explicit", "session"], default="explicit")
# The task key of lease mode `session`, sent in `Leasegate-Task` over HTTP.
parser.add_argument("--task")
parser.add_argument("--run-id")
parser.add_argument("--owner")
parser.add_argument("--epoch", type=int)
# The lease's secret token; from the environment so it is not on the command line.
parser.add_argument("--lease-token", default=os.environ.get("LEASEGATE_LEASE_TOKEN"))
parser.add_argument("--interactive", default="yes")
parser.add_argument("--mailer-state", default="")
parser.add_argument("--tag", default="t")
args = parser.parse_args()
if args.lease == "explicit" and None in (args.run_id, args.owner, args.epoch):
    parser.error("--lease explicit needs --run-id, --owner and --epoch")
if args.lease == "session" and args.server != "stdio" and not args.task:
    parser.error("--lease session over HTTP needs --task")

DEADLINE = 30.0
UP = args.upstream
# In lease mode `session` the agent is unmodified: no lease in `_meta`.
LEASE = None if args.lease == "session" else {
    "dev.leasegate/lease": {"run_id": args.run_id, "owner": args.owner, "epoch": args.epoch,
                            "token": args.lease_token}}
def tool(name):
    return f"{UP}__{name}"


def server():
    if args.server == "stdio":
        command = json.loads(args.stdio_command)
        return StdioServerParameters(command=command[0], args=command[1:], env={"RUST_LOG": "warn"})
    if args.lease == "session":
        return with_task_header(args.server)
    return args.server


@contextlib.asynccontextmanager
async def with_task_header(url):
    # The SDK's own Streamable HTTP transport on an HTTP client that sends the
    # header on every request (the SDK's default timeouts: a held-open
    # response stream may be quiet for minutes).
    headers = {"Leasegate-Task": args.task}
    timeout = httpx2.Timeout(30.0, read=300.0)
    async with httpx2.AsyncClient(headers=headers, timeout=timeout) as http:
        async with streamable_http_client(url, http_client=http) as streams:
            yield streams


sampled, elicited, rooted, logs, messages = [], [], [], [], []


async def on_sampling(ctx, params):
    sampled.append(params)
    return types.CreateMessageResult(
        role="assistant", content=types.TextContent(type="text", text="sampled by the agent"), model="agent-model"
    )


async def on_elicitation(ctx, params):
    elicited.append(getattr(params, "mode", "form") or "form")
    if getattr(params, "mode", None) == "url":
        return types.ElicitResult(action="accept")
    return types.ElicitResult(action="accept", content={"name": "Ada", "check": True, "email": "ada@example.com"})


async def on_roots(ctx):
    rooted.append(1)
    return types.ListRootsResult(roots=[types.Root(uri="file:///agent/root", name="agent-root")])


async def on_log(params):
    logs.append(params)


async def on_message(message):
    if not isinstance(message, Exception):
        messages.append(getattr(message, "method", None))


def dump(result):
    return result.model_dump(by_alias=True, exclude_none=True, mode="json")


async def wait_for(what, probe, deadline=DEADLINE):
    end = time.monotonic() + deadline
    while time.monotonic() < end:
        value = await probe()
        if value:
            return value
        await anyio.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


async def value_of(value):
    return value


async def check(name, body):
    try:
        detail = await body()
        report(name, True, detail)
    except Exception as error:  # noqa: BLE001 - every failure is reported, not raised
        report(name, False, f"{type(error).__name__}: {error}\n{traceback.format_exc()[-1500:]}")


async def main():
    async with Client(
        server(),
        mode=args.mode,
        sampling_callback=on_sampling,
        elicitation_callback=on_elicitation,
        list_roots_callback=on_roots,
        logging_callback=on_log,
        message_handler=on_message,
        log_level="debug" if args.mode != "legacy" else None,
    ) as client:
        modern = client.protocol_version >= "2026-07-28"
        report("negotiated", True, {"protocol_version": client.protocol_version})

        async def tools_listed():
            async def probe():
                names = {t.name for t in (await client.list_tools()).tools}
                wanted = {tool(n) for n in ("echo", "get-sum", "trigger-sampling-request", "trigger-elicitation-request",
                                             "get-roots-list", "trigger-url-elicitation")}
                return names if wanted <= names else None
            names = await wait_for("the upstream's capability-dependent tools", probe)
            return sorted(n for n in names if n.startswith(UP + "__"))
        await check("tools_list", tools_listed)

        async def pass_through():
            result = await client.call_tool(tool("get-sum"), {"a": 2, "b": 40})
            text = result.content[0].text
            assert "42" in text, text
            assert not result.is_error
            return text
        await check("read_only_pass_through", pass_through)

        async def gated():
            message = f"gated {args.tag}"
            first = await client.call_tool(tool("echo"), {"message": message}, meta=LEASE)
            again = await client.call_tool(tool("echo"), {"message": message}, meta=LEASE)
            note1 = dump(first).get("_meta", {}).get("dev.leasegate/operation")
            note2 = dump(again).get("_meta", {}).get("dev.leasegate/operation")
            assert first.content[0].text == f"Echo: {message}", first.content
            assert note1 and note1["status"] == "succeeded" and note1["replayed"] is False, note1
            assert note2 and note2["replayed"] is True and note2["operation_id"] == note1["operation_id"], note2
            return note1
        await check("gated_call_and_replay", gated)

        async def structured():
            result = await client.call_tool(tool("get-structured-content"), {"location": "New York"})
            assert result.structured_content and "temperature" in result.structured_content, dump(result)
            return result.structured_content
        await check("structured_content", structured)

        async def rich():
            image = await client.call_tool(tool("get-tiny-image"), {})
            kinds = [c.type for c in image.content]
            assert "image" in kinds, kinds
            links = await client.call_tool(tool("get-resource-links"), {"count": 2})
            uris = [c.uri for c in links.content if c.type == "resource_link"]
            assert uris and all(str(u).startswith(f"{UP}+demo://") for u in uris), uris
            return {"image": kinds, "links": [str(u) for u in uris]}
        await check("rich_content", rich)

        async def embedded():
            result = await client.call_tool(tool("get-resource-reference"), {"resourceType": "Text", "resourceId": 3})
            uris = [str(c.resource.uri) for c in result.content if c.type == "resource"]
            assert uris == [f"{UP}+demo://resource/dynamic/text/3"], dump(result)
            prompt = await client.get_prompt(tool("resource-prompt"), {"resourceType": "Text", "resourceId": "4"})
            in_prompt = [str(m.content.resource.uri) for m in prompt.messages if m.content.type == "resource"]
            assert in_prompt == [f"{UP}+demo://resource/dynamic/text/4"], in_prompt
            return {"tool": uris, "prompt": in_prompt}
        await check("embedded_resources_named_as_exposed", embedded)

        async def tool_error():
            result = await client.call_tool(tool("get-sum"), {"a": "not a number", "b": 1})
            assert result.is_error, dump(result)
            return result.content[0].text[:120]
        await check("tool_error_as_result", tool_error)

        async def unicode_nul():
            payload = "\u0000 héllo 世界 🦀 \u2028 \U0010ffff " * 2000
            result = await client.call_tool(tool("echo"), {"message": payload}, meta=LEASE)
            assert not result.is_error, result.content[0].text[:200]
            assert result.content[0].text == f"Echo: {payload}", "echo differs"
            again = await client.call_tool(tool("echo"), {"message": payload}, meta=LEASE)
            assert again.content[0].text == f"Echo: {payload}", "replay differs"
            note = dump(again)["_meta"]["dev.leasegate/operation"]
            assert note["replayed"] is True, note
            return {"bytes": len(payload.encode()), "operation": note["operation_id"]}
        await check("unicode_and_nul_through_the_ledger", unicode_nul)

        if args.mailer_state:
            async def one_mib():
                body = ("\u0000 héllo 世界 🦀 " + "x" * 1000) * 1100
                body = body[: 1024 * 1024]
                to = f"big-{args.tag}@example.com"
                result = await client.call_tool("mailer__send_email", {"to": to, "body": body}, meta=LEASE)
                assert not result.is_error, dump(result)
                with open(os.path.join(args.mailer_state, "emails.jsonl")) as f:
                    sent = [json.loads(line) for line in f if to in line]
                assert len(sent) == 1 and sent[0].get("body") == body, [len(s.get("body", "")) for s in sent]
                return {"argument_bytes": len(json.dumps({"to": to, "body": body}).encode())}
            await check("one_mib_arguments_through_the_ledger", one_mib)

        async def numbers():
            seen = {}
            for a, b, expected in [(1e21, 0, "1e+21"), (-0.0, 0, "0"), (9007199254740993, 0, "9007199254740992"),
                                   (1.2e29, 0, "1.2e+29"), (5e-324, 0, "5e-324")]:
                result = await client.call_tool(tool("get-sum"), {"a": a, "b": b})
                text = result.content[0].text
                assert not result.is_error and expected in text, (a, text)
                seen[repr(a)] = text
            return seen
        await check("number_edge_cases_pass_through", numbers)

        async def number_arguments():
            # Values JSON-RPC parsing or RFC 8785 would merge with a
            # neighbour, each in a gated call with the same other arguments:
            # refused, so that none becomes an intent (merged or rounded)
            # and none is sent. The SDK writes 2^64 as a float,
            # 18446744073709551616.0 in Python, as 1.8446744073709552e+19,
            # so the last two are one spelling on the wire (the raw
            # agents of raw_fidelity.rs send the others).
            message = f"numbers {args.tag}"
            refused = []
            for value in (2**64, 2**64 + 1, 18446744073709551616.0, 1.8446744073709552e19):
                try:
                    result = await client.call_tool(tool("echo"), {"message": message, "n": value}, meta=LEASE)
                except MCPError as error:
                    assert error.code == -32602, (value, error.code, error.message)
                    reason = (error.data or {}).get("reason")
                    expected = "inexact_number" if isinstance(value, int) else "unsafe_integer"
                    assert reason == expected, (value, reason, error.message)
                    refused.append({"value": repr(value), "reason": reason})
                    continue
                raise AssertionError(f"{value!r} reached the tool: {dump(result)}")
            # An exact value within ±2^53 goes through, once, unchanged.
            exact = 9007199254740991
            result = await client.call_tool(tool("echo"), {"message": message, "n": exact}, meta=LEASE)
            note = dump(result).get("_meta", {}).get("dev.leasegate/operation")
            assert not result.is_error and result.content[0].text == f"Echo: {message}", dump(result)
            assert note and note["status"] == "succeeded" and note["replayed"] is False, note
            return {"refused": refused, "exact": note["operation_id"]}
        await check("number_arguments", number_arguments)

        async def concurrent():
            results = {}

            async def one(i):
                result = await client.call_tool(tool("echo"), {"message": f"c{i} {args.tag}"}, meta=LEASE)
                results[i] = result.content[0].text

            async with anyio.create_task_group() as group:
                for i in range(50):
                    group.start_soon(one, i)
            wrong = [i for i, text in results.items() if text != f"Echo: c{i} {args.tag}"]
            assert len(results) == 50 and not wrong, wrong
            return len(results)
        await check("fifty_concurrent_gated_calls", concurrent)

        async def progress():
            updates = []

            async def on_progress(value, total, message):
                updates.append(value)

            result = await client.call_tool(
                tool("trigger-long-running-operation"), {"duration": 1, "steps": 5}, progress_callback=on_progress
            )
            assert not result.is_error
            assert updates == [1, 2, 3, 4, 5], updates
            return updates
        await check("progress_all_in_order_before_the_result", progress)

        async def two_sessions():
            # A second client (its request ids collide with the first's):
            # each sees exactly its own call's progress.
            async with Client(server(), mode=args.mode) as other:
                seen = {"first": [], "second": []}

                async def run(name, who, steps):
                    async def on_progress(value, total, message):
                        seen[name].append((value, total))
                    await who.call_tool(
                        tool("trigger-long-running-operation"),
                        {"duration": 1, "steps": steps},
                        progress_callback=on_progress,
                    )

                async with anyio.create_task_group() as group:
                    group.start_soon(run, "first", client, 4)
                    group.start_soon(run, "second", other, 6)
            assert seen["first"] == [(i, 4) for i in range(1, 5)], seen
            assert seen["second"] == [(i, 6) for i in range(1, 7)], seen
            return seen
        await check("progress_two_sessions_no_cross_talk", two_sessions)

        async def prompts():
            listed = [p.name for p in (await client.list_prompts()).prompts]
            assert tool("args-prompt") in listed, listed
            got = await client.get_prompt(tool("args-prompt"), {"city": "Paris", "state": "FR"})
            text = got.messages[0].content.text
            assert "Paris" in text, text
            return listed
        await check("prompts", prompts)

        async def resources():
            listed = [str(r.uri) for r in (await client.list_resources()).resources]
            assert f"{UP}+demo://resource/static/document/architecture.md" in listed, listed
            templates = [t.uri_template for t in (await client.list_resource_templates()).resource_templates]
            assert f"{UP}+demo://resource/dynamic/text/{{resourceId}}" in templates, templates
            read = await client.read_resource(f"{UP}+demo://resource/dynamic/text/7")
            assert str(read.contents[0].uri) == f"{UP}+demo://resource/dynamic/text/7", read.contents[0].uri
            return {"resources": len(listed), "templates": templates}
        await check("resources", resources)

        async def completions():
            done = await client.complete(
                types.PromptReference(type="ref/prompt", name=tool("completable-prompt")),
                {"name": "department", "value": "E"},
            )
            assert "Engineering" in done.completion.values, done.completion.values
            return done.completion.values
        await check("completions", completions)

        if args.mailer_state:
            async def cancellation():
                state = args.mailer_state
                to = f"cancel-{args.tag}@example.com"
                answered_before = late_answers.cancelled_answers()

                def emails():
                    try:
                        with open(os.path.join(state, "emails.jsonl")) as f:
                            return [json.loads(line) for line in f if to in line]
                    except FileNotFoundError:
                        return []

                async with anyio.create_task_group() as group:
                    async def call():
                        await client.call_tool("mailer__send_email", {"to": to, "hang_ms": 20000}, meta=LEASE)
                        raise AssertionError("the cancelled call delivered a result")
                    scope = anyio.CancelScope()

                    async def cancellable():
                        with scope:
                            await call()
                    group.start_soon(cancellable)
                    await wait_for("the email to reach the tool", lambda: anyio.to_thread.run_sync(emails))
                    scope.cancel()

                def cancel_seen():
                    try:
                        with open(os.path.join(state, "calls.jsonl")) as f:
                            return any(to in line and '"cancelled":true' in line.replace(" ", "") for line in f)
                    except FileNotFoundError:
                        return False

                # Stay connected until the tool saw the cancel (the SDK sends
                # notifications/cancelled in the background).
                await wait_for("the cancel to reach the tool", lambda: anyio.to_thread.run_sync(cancel_seen))
                # On the stateless front a handshake-era client keeps the
                # cancelled request's POST open, and leasegate answers it at
                # once (-32800): wait until that answer was received. A
                # 2026-07-28 client aborts the POST instead, and with a
                # session (or over stdio) a cancelled request gets no answer.
                if args.front == "stateless" and not modern:
                    await wait_for("leasegate's -32800 to the cancelled call",
                                   lambda: value_of(late_answers.cancelled_answers() > answered_before))
                return {"cancelled": to, "late_answers": late_answers.cancelled_answers() - answered_before}
            await check("cancellation_reaches_the_upstream", cancellation)

        if args.interactive == "yes":
            async def sampling():
                result = await client.call_tool(tool("trigger-sampling-request"), {"prompt": "hi", "maxTokens": 5})
                text = result.content[0].text
                assert "sampled by the agent" in text, text
                return text[:100]
            await check("sampling", sampling)

            async def elicitation():
                result = await client.call_tool(tool("trigger-elicitation-request"), {})
                text = json.dumps(dump(result))
                assert "Ada" in text and not result.is_error, text[:300]
                return elicited
            await check("elicitation_form", elicitation)

            async def roots():
                result = await client.call_tool(tool("get-roots-list"), {})
                text = result.content[0].text
                assert "file:///agent/root" in text, text
                return text[:100]
            await check("roots", roots)

        if modern:
            async def stale_request_state():
                try:
                    await client.call_tool(tool("echo"), {"message": "x"}, meta=LEASE,
                                           input_responses={"k": types.ListRootsResult(roots=[])},
                                           request_state="not-a-handle")
                except Exception as error:  # noqa: BLE001
                    assert getattr(error, "code", None) == -32602, repr(error)
                    assert "requestState" in str(error), str(error)
                    return str(error)[:160]
                raise AssertionError("a made-up requestState was accepted")
            await check("unknown_request_state_refused", stale_request_state)

            async def listen():
                async with client.listen(resources_list_changed=True, tools_list_changed=True) as sub:
                    await client.call_tool(
                        tool("gzip-file-as-resource"),
                        {"name": f"{args.tag}-listen.gz", "data": "data:text/plain,hi", "outputType": "resourceLink"},
                    )
                    with anyio.fail_after(DEADLINE):
                        async for event in sub:
                            return type(event).__name__
                raise AssertionError("the subscription ended without an event")
            await check("subscriptions_listen", listen)

        if args.interactive == "yes" and not modern:
            async def logging():
                await client.set_logging_level("debug")
                await client.call_tool(tool("toggle-simulated-logging"), {})
                entry = await wait_for("a log message", lambda: value_of(list(logs)))
                loggers = {l.logger for l in entry}
                assert any(lg and lg.startswith(UP) for lg in loggers), loggers
                await client.call_tool(tool("toggle-simulated-logging"), {})
                return sorted(str(lg) for lg in loggers)
            await check("logging", logging)

            async def subscribe():
                uri = f"{UP}+demo://resource/dynamic/text/1"
                await client.subscribe_resource(uri)
                await client.call_tool(tool("toggle-subscriber-updates"), {})
                await wait_for("resources/updated", lambda: value_of("notifications/resources/updated" in messages))
                await client.call_tool(tool("toggle-subscriber-updates"), {})
                await client.unsubscribe_resource(uri)
                return True
            await check("resource_subscription", subscribe)

            async def list_changed():
                before = messages.count("notifications/resources/list_changed")
                await client.call_tool(
                    tool("gzip-file-as-resource"),
                    {"name": f"{args.tag}.gz", "data": "data:text/plain,hello", "outputType": "resourceLink"},
                )
                await wait_for(
                    "resources/list_changed",
                    lambda: value_of(messages.count("notifications/resources/list_changed") > before),
                )
                return True
            await check("list_changed", list_changed)


try:
    anyio.run(main)
except Exception as error:  # noqa: BLE001
    report("session", False, f"{type(error).__name__}: {error}\n{traceback.format_exc()[-2000:]}")
sys.exit(1 if report_module.failures else 0)
