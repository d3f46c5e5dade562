"""fastmcp's client and a pydantic-ai agent against leasegate, with no LLM.
(Not named agents.py: scripts in this directory import the OpenAI Agents
SDK's `agents` package, which that name would shadow.)

Run by the Rust suite (tests/external/agent_frameworks.rs) as a child
process; the suite counts side effects and ledger rows itself. This script
drives each client the way a user's code does, in its default settings, and
reports what the user (fastmcp) or the model (pydantic-ai: what its
FunctionModel is handed) gets back:

  agent_clients.py --url URL --key KEY replay-fastmcp
      The docs/clients.md fastmcp lines, twice with one key, then once with
      no key. One JSON line per call:
      {"call": "first"|"again", "structured", "texts", "note", "data"} and
      {"call": "unkeyed", "error_code", "error"}; then a charge under the key
      KEY-unknown that hangs past the tool's timeout (its outcome unknown):
      {"call": "unknown", "error"} (fastmcp raises a tool error's text).

  agent_clients.py --url URL --key KEY replay-pydantic-ai
      The docs/clients.md pydantic-ai lines: two agent runs whose model asks
      for the same charge, then a run whose charge (key KEY-unknown) hangs
      past the tool's timeout. One line per run: {"run", "model_read",
      "kind"}, what the model was handed as the tool's return (or retry).

  agent_clients.py --url URL --key KEY refused-pydantic-ai
      An agent with default retries whose model asks, every turn, for two
      charges at once: one with an idempotency key (hanging a while after it
      charged), one without (which leasegate refuses). Prints
      {"run": "failed"|"ended", "error_type", "error"} and
      {"model_turns", "keyed", "unkeyed", "model_read"}: the calls the model
      asked for and the retry texts it was handed.

  agent_clients.py --url URL --lease-json LEASE lost-lease-pydantic-ai
      An agent with default retries whose calls carry LEASE (a
      `dev.leasegate/lease` object another worker has since taken over) in
      `_meta`; its model asks for a charge every turn. Prints the same two
      lines as refused-pydantic-ai (its calls under "keyed").

  agent_clients.py --stdio-command JSON_ARGV unstarted-pydantic-ai
      An agent whose toolset spawns JSON_ARGV (a `leasegate stdio` that
      cannot start) as its stdio MCP server: {"run", "error_type", "error"}.

Exit 0 when the scenario ran to its report, 2 when the 60 s deadline passed.
"""

import argparse
import asyncio
import json
import os
import sys
import threading
import warnings

warnings.simplefilter("ignore")

DEADLINE = 60.0
KEY_META = "dev.leasegate/idempotency_key"
NOTE_META = "dev.leasegate/operation"

parser = argparse.ArgumentParser()
parser.add_argument("scenario", choices=["replay-fastmcp", "replay-pydantic-ai", "refused-pydantic-ai",
                                         "lost-lease-pydantic-ai", "unstarted-pydantic-ai"])
parser.add_argument("--url")
parser.add_argument("--key", default="order-42-charge")
parser.add_argument("--stdio-command", default="[]")
parser.add_argument("--lease-json", default="null")
opts = parser.parse_args()
url = opts.url


def report(**line):
    print(json.dumps(line, default=str), flush=True)


def texts(result):
    return [getattr(block, "text", None) for block in result.content]


def error_code(error):
    """The JSON-RPC code of the MCP error somewhere in the chain, if any."""
    seen, stack = set(), [error]
    while stack:
        e = stack.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        for code in (getattr(e, "code", None), getattr(getattr(e, "error", None), "code", None)):
            if isinstance(code, int):
                return code
        stack += [e.__cause__, e.__context__, *getattr(e, "exceptions", ())]
    return None


async def charge_with_fastmcp(key, hang_ms=None):
    import fastmcp

    if hang_ms is not None:
        async with fastmcp.Client(url) as client:
            return await client.call_tool("payments__charge", {"amount": 6, "currency": "eur", "hang_ms": hang_ms},
                                          meta={"dev.leasegate/idempotency_key": key})
    # docs/clients.md, fastmcp: these lines as written there.
    async with fastmcp.Client(url) as client:
        result = await client.call_tool("payments__charge", {"amount": 5, "currency": "eur"},
                                        meta={"dev.leasegate/idempotency_key": key})
    return result


async def replay_fastmcp():
    import fastmcp

    for call in ["first", "again"]:
        result = await charge_with_fastmcp(opts.key)
        report(call=call, structured=result.structured_content, texts=texts(result),
               note=(result.meta or {}).get(NOTE_META), data=result.data)
    async with fastmcp.Client(url) as client:
        try:
            await client.call_tool("payments__charge", {"amount": 5, "currency": "eur"})
            report(call="unkeyed", error_code=None, error=None)
        except Exception as error:  # noqa: BLE001 - reported
            report(call="unkeyed", error_code=error_code(error), error=str(error))
    try:
        result = await charge_with_fastmcp(f"{opts.key}-unknown", hang_ms=3000)
        report(call="unknown", error=None, texts=texts(result))
    except Exception as error:  # noqa: BLE001 - reported
        report(call="unknown", error=str(error))


def tool_returns(messages):
    """What the model was handed as tool returns and retry prompts, in order."""
    from pydantic_ai.messages import RetryPromptPart, ToolReturnPart

    handed = []
    for message in messages:
        for part in getattr(message, "parts", []):
            if isinstance(part, (ToolReturnPart, RetryPromptPart)):
                handed.append({"kind": type(part).__name__, "content": part.content,
                               "text": part.model_response_str() if hasattr(part, "model_response_str") else None})
    return handed


async def replay_pydantic_ai():
    from pydantic_ai import Agent
    from pydantic_ai.mcp import MCPToolset
    from pydantic_ai.messages import ModelResponse, TextPart, ToolCallPart
    from pydantic_ai.models.function import FunctionModel

    def key_for(ctx, name, tool_args):
        # The same charge in the first two runs: the same key.
        return f"{opts.key}-unknown" if "hang_ms" in tool_args else opts.key

    read = []
    charges = [{"amount": 5, "currency": "eur"}, {"amount": 5, "currency": "eur"},
               {"amount": 6, "currency": "eur", "hang_ms": 3000}]

    def charge_once(messages, info):
        handed = tool_returns(messages)
        if not handed:
            return ModelResponse(parts=[ToolCallPart("payments__charge", charges[len(read)])])
        read.append(handed[-1])
        return ModelResponse(parts=[TextPart("charged")])

    model = FunctionModel(charge_once)

    # docs/clients.md, pydantic-ai: these lines as written there.
    async def keyed(ctx, call_tool, name, args):
        return await call_tool(name, args, metadata={"dev.leasegate/idempotency_key": key_for(ctx, name, args)})

    agent = Agent(model, toolsets=[MCPToolset(url, process_tool_call=keyed)])

    for run in range(len(charges)):
        await agent.run("charge")
        report(run=str(run), model_read=read[-1]["content"], kind=read[-1]["kind"])


async def refused_pydantic_ai():
    from pydantic_ai import Agent
    from pydantic_ai.mcp import MCPToolset
    from pydantic_ai.messages import ModelResponse, ToolCallPart
    from pydantic_ai.models.function import FunctionModel

    asked = {"keyed": [], "unkeyed": []}
    turns = []

    def two_charges_a_turn(messages, info):
        # Never gives up on its own: only the agent's retry limit ends it.
        turns.append(tool_returns(messages))
        turn = len(turns)
        keyed = {"amount": 100 + turn, "currency": "eur", "hang_ms": 1500}
        unkeyed = {"amount": 200 + turn, "currency": "eur"}
        asked["keyed"].append(keyed["amount"])
        asked["unkeyed"].append(unkeyed["amount"])
        return ModelResponse(parts=[ToolCallPart("payments__charge", keyed),
                                    ToolCallPart("payments__charge", unkeyed)])

    async def keyed_below_200(ctx, call_tool, name, tool_args):
        # The agent's own rule: a key for some calls; leasegate in key mode
        # refuses the others.
        amount = tool_args["amount"]
        metadata = {KEY_META: f"{opts.key}-{amount}"} if amount < 200 else None
        return await call_tool(name, tool_args, metadata=metadata)

    agent = Agent(FunctionModel(two_charges_a_turn),
                  toolsets=[MCPToolset(url, process_tool_call=keyed_below_200)])
    try:
        await agent.run("charge twice")
        report(run="ended", error_type=None, error=None)
    except Exception as error:  # noqa: BLE001 - reported
        report(run="failed", error_type=type(error).__name__, error=str(error))
    handed = [h for turn in turns for h in turn]
    report(model_turns=len(turns), keyed=asked["keyed"], unkeyed=asked["unkeyed"],
           model_read=[h["text"] or h["content"] for h in handed])


async def lost_lease_pydantic_ai():
    from pydantic_ai import Agent
    from pydantic_ai.mcp import MCPToolset
    from pydantic_ai.messages import ModelResponse, ToolCallPart
    from pydantic_ai.models.function import FunctionModel

    lease = json.loads(opts.lease_json)
    asked, turns = [], []

    def a_charge_a_turn(messages, info):
        turns.append(tool_returns(messages))
        asked.append(300 + len(turns))
        return ModelResponse(parts=[ToolCallPart("payments__charge", {"amount": asked[-1], "currency": "eur"})])

    async def with_lease(ctx, call_tool, name, tool_args):
        return await call_tool(name, tool_args, metadata={"dev.leasegate/lease": lease})

    agent = Agent(FunctionModel(a_charge_a_turn), toolsets=[MCPToolset(url, process_tool_call=with_lease)])
    try:
        await agent.run("charge")
        report(run="ended", error_type=None, error=None)
    except Exception as error:  # noqa: BLE001 - reported
        report(run="failed", error_type=type(error).__name__, error=str(error))
    handed = [h for turn in turns for h in turn]
    report(model_turns=len(turns), keyed=asked, unkeyed=[],
           model_read=[h["text"] or h["content"] for h in handed])


async def unstarted_pydantic_ai():
    from fastmcp.client.transports import StdioTransport
    from pydantic_ai import Agent
    from pydantic_ai.mcp import MCPToolset
    from pydantic_ai.messages import ModelResponse, TextPart
    from pydantic_ai.models.function import FunctionModel

    argv = json.loads(opts.stdio_command)
    transport = StdioTransport(command=argv[0], args=argv[1:], env=dict(os.environ))
    agent = Agent(FunctionModel(lambda messages, info: ModelResponse(parts=[TextPart("none")])),
                  toolsets=[MCPToolset(transport)])
    try:
        await agent.run("list your tools")
        report(run="ended", error_type=None, error=None)
    except BaseException as error:  # noqa: BLE001 - reported (groups included)
        leaves, seen, stack = [], set(), [error]
        while stack:
            e = stack.pop()
            if e is None or id(e) in seen:
                continue
            seen.add(id(e))
            inner = getattr(e, "exceptions", None)
            if inner:
                stack += inner
            else:
                leaves.append(e)
                stack += [e.__cause__, e.__context__]
        report(run="failed", error_type=type(error).__name__,
               error=" | ".join(f"{type(e).__name__}: {e}" for e in leaves),
               error_code=error_code(error))


def timed_out():
    # A hung transport teardown must not hold the suite: leave at once.
    print(json.dumps({"timeout": DEADLINE}), file=sys.stderr, flush=True)
    sys.stdout.flush()
    os._exit(2)


watchdog = threading.Timer(DEADLINE, timed_out)
watchdog.daemon = True
watchdog.start()
asyncio.run({
    "replay-fastmcp": replay_fastmcp,
    "replay-pydantic-ai": replay_pydantic_ai,
    "refused-pydantic-ai": refused_pydantic_ai,
    "lost-lease-pydantic-ai": lost_lease_pydantic_ai,
    "unstarted-pydantic-ai": unstarted_pydantic_ai,
}[opts.scenario]())
sys.stdout.flush()
os._exit(0)
