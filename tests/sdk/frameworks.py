"""Agent frameworks' own MCP clients against leasegate, with no model in the loop.

Run by the Rust suite as a child process; the suite counts side effects and
ledger rows itself. This script only drives the frameworks the way an agent
run would (their tool objects, their sessions, their defaults) and reports
what each call came back with:

  frameworks.py --framework langchain|openai --transport stdio|http
                --mode session|key --calls N --tool NAME --arguments-json TEMPLATE
                [--url URL] [--stdio-command JSON_ARGV] [--header NAME=VALUE ...]
                [--key-prefix P] [--repeat N]

The N calls of a batch run concurrently (asyncio.gather); --repeat runs the
same batch again with the same arguments and keys, so later batches should be
ledger replays. In TEMPLATE a string value that is exactly "{i}" becomes the
integer call index, any other "{i}" inside a string is replaced textually.

--mode session: the task key travels per connection (the `leasegate-task`
header given with --header, or `--task` inside --stdio-command); nothing per
call. --mode key: call i carries the idempotency key "<key-prefix>-<i>".

Prints one JSON line per call:
  {"batch", "call", "ok", "error_code", "error", "operation"}
where operation is leasegate's `_meta["dev.leasegate/operation"]` note when
the framework lets us see the raw CallToolResult. Exit 0 when every call was
ok, 1 otherwise, 2 when the 60 s deadline passed.

The task key from the framework's own run identity (lease mode session, over
HTTP):

  frameworks.py langgraph-thread|openai-group --url URL --thread ID --amount N
                [--replan]

One conversation under ID, a LangGraph `thread_id` or an Agents SDK
`group_id`, which also becomes its `Leasegate-Task` header: a first run asks
for a charge of N and dies after the tool answered, before it could use the
answer; a second run, with a new MCP client and a new graph or runner call
under the same ID, asks for the charge again: with the same arguments (a
LangGraph checkpoint resume, an Agents SDK run retried), or, with --replan,
with another `idempotency_key` argument (what a model planning the call anew
picks). Prints one JSON line per charge call:
  {"attempt", "arguments", "operation", "model_read"}
where model_read is what the model was handed of an answer it got (null for
the lost one). Exit 0 when both runs went as described, 1 otherwise.

Pins: tests/sdk/frameworks-requirements.txt, a venv of its own (the adapters
need mcp<2; the suite's SDK venv has mcp 2.x), so both frameworks speak the
handshake-era protocol. langchain over stdio spawns one `leasegate stdio` per
call: keep database_max_connections low enough for N+1 processes to fit in
PostgreSQL's max_connections, or calls fail for want of a ledger connection.
"""

import argparse
import asyncio
import contextvars
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
parser.add_argument("scenario", nargs="?", choices=["langgraph-thread", "openai-group"])
parser.add_argument("--framework", choices=["langchain", "openai"])
parser.add_argument("--transport", choices=["stdio", "http"])
parser.add_argument("--mode", choices=["session", "key"])
parser.add_argument("--calls", type=int, default=16)
parser.add_argument("--tool")
parser.add_argument("--arguments-json")
parser.add_argument("--url")
parser.add_argument("--stdio-command", default="[]")
parser.add_argument("--header", action="append", default=[])
parser.add_argument("--key-prefix", default="fw")
parser.add_argument("--repeat", type=int, default=1)
parser.add_argument("--thread")
parser.add_argument("--amount", type=int, default=5)
parser.add_argument("--replan", action="store_true")
args = parser.parse_args()
if args.scenario is None:
    missing = [f"--{name.replace('_', '-')}" for name in ("framework", "transport", "mode", "tool", "arguments_json")
               if getattr(args, name) is None]
    if missing:
        parser.error(f"the parallel calls need {', '.join(missing)}")
elif not (args.url and args.thread):
    parser.error(f"{args.scenario} needs --url and --thread")

TEMPLATE = json.loads(args.arguments_json or "null")
HEADERS = dict(h.split("=", 1) for h in args.header)
ARGV = json.loads(args.stdio_command)
if args.transport == "http" and not args.url:
    parser.error("--transport http needs --url")
if args.transport == "stdio" and not ARGV:
    parser.error("--transport stdio needs --stdio-command")
# leasegate's own logs go to our stderr through the stdio child; keep them short.
STDIO_ENV = {**os.environ, "RUST_LOG": os.environ.get("RUST_LOG", "warn")}


class Call:
    """What one call sent and what the framework let us see of its answer."""

    def __init__(self, index):
        self.index = index
        self.key = f"{args.key_prefix}-{index}" if args.mode == "key" else None
        self.note = None
        self.is_error = False

    def saw(self, result):
        meta = getattr(result, "meta", None) or {}
        self.note = meta.get(NOTE_META) if isinstance(meta, dict) else None
        self.is_error = bool(getattr(result, "isError", False))


# The frameworks' hooks get no handle on "which of our calls is this"; each
# gathered call runs in its own task, so a context variable carries it there.
CURRENT = contextvars.ContextVar("call")


def arguments_for(i, value=TEMPLATE):
    if value == "{i}":
        return i
    if isinstance(value, str):
        return value.replace("{i}", str(i))
    if isinstance(value, dict):
        return {k: arguments_for(i, v) for k, v in value.items()}
    if isinstance(value, list):
        return [arguments_for(i, v) for v in value]
    return value


def leaves(error):
    """An exception group's innermost exceptions (anyio wraps transport errors)."""
    inner = getattr(error, "exceptions", None)
    return [leaf for e in inner for leaf in leaves(e)] if inner else [error]


def describe(error):
    return "; ".join(f"{type(e).__name__}: {e}" for e in leaves(error))[:1000]


def error_code(error):
    """The JSON-RPC code of the McpError/MCPError somewhere in the chain, if any."""
    seen, stack = set(), [error]
    while stack:
        e = stack.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        code = getattr(getattr(e, "error", None), "code", None)
        if isinstance(code, int):
            return code
        stack += [e.__cause__, e.__context__, *getattr(e, "exceptions", ())]
    return None


async def langchain_calls():
    """langchain-mcp-adapters, default client: a fresh MCP session per tool call."""
    from langchain_mcp_adapters.client import MultiServerMCPClient
    from langchain_mcp_adapters.sessions import create_session
    from mcp.types import CallToolResult

    if args.transport == "http":
        connection = {"transport": "streamable_http", "url": args.url, "headers": HEADERS}
    else:
        connection = {"transport": "stdio", "command": ARGV[0], "args": ARGV[1:], "env": STDIO_ENV}

    async def interceptor(request, handler):
        # Tool interceptors (langchain_mcp_adapters/interceptors.py,
        # MCPToolCallRequest) are the adapters' per-call hook. They can change
        # name, args and HTTP headers only: tools.py calls
        # ClientSession.call_tool without `_meta`. So over HTTP the key rides
        # the Idempotency-Key header; over stdio the interceptor short-circuits
        # (a documented use of interceptors) and makes the call itself on a
        # session from the adapters' own create_session, adding `_meta`.
        call = CURRENT.get()
        if call.key is None:
            result = await handler(request)
        elif args.transport == "http":
            result = await handler(request.override(headers={"Idempotency-Key": call.key}))
        else:
            async with create_session(connection) as session:
                await session.initialize()
                result = await session.call_tool(request.name, request.args, meta={KEY_META: call.key})
        # The adapters drop the result's `_meta` when they convert it, and
        # with their default handle_tool_errors an isError result comes back
        # as plain content; the raw result is only visible here.
        if isinstance(result, CallToolResult):
            call.saw(result)
        return result

    client = MultiServerMCPClient({"leasegate": connection}, tool_interceptors=[interceptor])
    tools = {tool.name: tool for tool in await client.get_tools()}
    tool = tools[args.tool]

    async def invoke(call):
        CURRENT.set(call)
        await tool.ainvoke(arguments_for(call.index))

    yield invoke


async def openai_calls():
    """OpenAI Agents SDK: one connected MCPServer*, tools as an Agent sees them."""
    from agents import Agent, RunContextWrapper
    from agents.mcp import MCPServerStdio, MCPServerStreamableHttp
    from agents.tool_context import ToolContext

    def resolve_meta(ctx):
        # tool_meta_resolver (agents/mcp/util.py, MCPUtil._resolve_meta) is the
        # SDK's per-call `_meta` hook; run_context.context is our Call.
        key = ctx.run_context.context.key
        return {KEY_META: key} if key else None

    def extract(ctx):
        # custom_data_extractor is the one place the raw result's `_meta`
        # and isError are still visible; the tool output keeps only content.
        call = ctx.run_context.context
        call.note = (ctx.result_meta or {}).get(NOTE_META)
        call.is_error = bool(ctx.is_error)
        return None

    common = dict(
        tool_meta_resolver=resolve_meta,
        custom_data_extractor=extract,
        # A real run turns a failed call into text for the model; None makes
        # the SDK raise instead (documented), so the JSON-RPC code survives.
        failure_error_function=None,
        # Longer than the SDK's 5 s so a slow ledger is not a client timeout.
        client_session_timeout_seconds=30,
        cache_tools_list=True,
    )
    # Note: MCPServerStreamableHttp serializes requests on its shared session
    # (agents/mcp/server.py, _serialize_session_requests), so over HTTP the
    # "parallel" calls reach leasegate one at a time. That is the SDK's default.
    if args.transport == "http":
        server = MCPServerStreamableHttp({"url": args.url, "headers": HEADERS, "timeout": 30}, **common)
    else:
        server = MCPServerStdio({"command": ARGV[0], "args": ARGV[1:], "env": STDIO_ENV}, **common)
    async with server:
        agent = Agent(name="driver", mcp_servers=[server])
        tools = {t.name: t for t in await agent.get_mcp_tools(RunContextWrapper(context=None))}
        tool = tools[args.tool]

        async def invoke(call):
            # What the runner does for a model's function call: on_invoke_tool
            # with a ToolContext around the run's context object.
            payload = json.dumps(arguments_for(call.index))
            context = ToolContext(context=call, tool_name=tool.name,
                                  tool_call_id=f"call-{call.index}", tool_arguments=payload)
            await tool.on_invoke_tool(context, payload)

        yield invoke


CHARGE = "payments__charge"


def planned_charge(attempt):
    """The charge the model asks for on an attempt: the same amount each time;
    with --replan, a model that plans the call anew picks another key."""
    arguments = {"amount": args.amount, "currency": "eur"}
    if args.replan:
        arguments["idempotency_key"] = f"picked-by-the-model-{attempt}"
    return arguments


def text_of(content):
    """A tool answer as the model reads it: the text of its content blocks."""
    if isinstance(content, str):
        return content
    return "\n".join(block.get("text", "") if isinstance(block, dict) else str(block) for block in content)


async def langgraph_thread():
    """A LangGraph agent graph (a planner node standing in for the model, then
    a ToolNode of the adapters' tools) with a checkpointer, under thread_id
    --thread. The first run's charge is answered, then the run dies before the
    tool step is checkpointed. A new client and a newly compiled graph on the
    same checkpointer go on with the thread: resumed from the checkpoint (the
    tool step again, the same call), or with --replan the user's message again,
    for which the planner plans the charge anew."""
    from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
    from langchain_mcp_adapters.client import MultiServerMCPClient
    from langgraph.checkpoint.memory import InMemorySaver
    from langgraph.graph import START, MessagesState, StateGraph
    from langgraph.prebuilt import ToolNode, tools_condition
    from mcp.types import CallToolResult

    async def task_from_thread(request, handler):
        thread_id = request.runtime.config["configurable"]["thread_id"]
        return await handler(request.override(headers={"Leasegate-Task": thread_id}))

    answers = []

    async def record(request, handler):
        # The adapters drop the result's `_meta`; the raw result is seen here.
        result = await handler(request)
        if isinstance(result, CallToolResult):
            answers.append(result)
        return result

    async def die_after_the_answer(request, handler):
        await handler(request)
        raise ConnectionError("the worker died before the tool step was checkpointed")

    def planner(attempt):
        def plan(state):
            if isinstance(state["messages"][-1], ToolMessage):
                return {"messages": [AIMessage("charged")]}
            call = {"name": CHARGE, "args": planned_charge(attempt), "id": f"call-{attempt}"}
            return {"messages": [AIMessage("", tool_calls=[call])]}
        return plan

    # A durable checkpointer shared by the worker that died and the one that
    # goes on; in memory here, as both runs are in this process.
    checkpointer = InMemorySaver()
    url, config = args.url, {"configurable": {"thread_id": args.thread}}
    ask = {"messages": [HumanMessage(f"charge {args.amount} eur")]}
    lines = []
    for attempt, interceptors in enumerate([[task_from_thread, die_after_the_answer, record],
                                            [task_from_thread, record]]):
        client = MultiServerMCPClient({"leasegate": {"transport": "streamable_http", "url": url}},
                                      tool_interceptors=interceptors)
        builder = StateGraph(MessagesState)
        builder.add_node("model", planner(attempt))
        builder.add_node("tools", ToolNode(await client.get_tools()))
        builder.add_edge(START, "model")
        builder.add_conditional_edges("model", tools_condition)
        builder.add_edge("tools", "model")
        graph = builder.compile(checkpointer=checkpointer)
        resumed = attempt > 0 and not args.replan
        try:
            state = await graph.ainvoke(None if resumed else ask, config)
        except ConnectionError:
            if attempt > 0:
                raise
            state = None
        replies = [m for m in (state or {}).get("messages", []) if isinstance(m, ToolMessage)]
        messages = (await graph.aget_state(config)).values["messages"]
        asked = [m for m in messages if isinstance(m, AIMessage) and m.tool_calls][-1].tool_calls[0]
        answer = answers[attempt] if attempt < len(answers) else None
        meta = (answer.meta or {}) if answer is not None else {}
        lines.append({"attempt": attempt, "arguments": asked["args"], "operation": meta.get(NOTE_META),
                      "model_read": text_of(replies[-1].content) if replies else None})
    return lines


async def openai_group():
    """OpenAI Agents SDK runs under RunConfig(group_id=--thread), with the SDK's
    scripted model (agents.testing) standing in for the LLM. The first run's
    charge is answered, then the model provider fails and so does the run; the
    app runs the turn again under the same group_id, with a new MCP server
    connection, and the model asks for the charge again."""
    from agents import Agent, RunConfig, Runner, set_tracing_disabled
    from agents.mcp import MCPServerStreamableHttp
    from agents.testing import ScriptedModel, assistant_message, function_call

    # No trace exporter in the suite; the group id is used here as the app
    # gives it to the SDK.
    set_tracing_disabled(True)
    url, conversation_id = args.url, args.thread
    lines = []
    for attempt in range(2):
        arguments = planned_charge(attempt)
        after_the_charge = (ConnectionError("the model provider went away") if attempt == 0
                            else [assistant_message("charged")])
        model = ScriptedModel([[function_call(CHARGE, arguments, call_id=f"call-{attempt}")], after_the_charge])
        seen = {}

        def extract(ctx):
            # The one place the raw result's `_meta` is still visible.
            seen["operation"] = (ctx.result_meta or {}).get(NOTE_META)
            return None

        run_config = RunConfig(group_id=conversation_id)
        async with MCPServerStreamableHttp({"url": url, "headers": {"Leasegate-Task": run_config.group_id}},
                                           custom_data_extractor=extract, client_session_timeout_seconds=30) as server:
            agent = Agent(name="payments", model=model, mcp_servers=[server])
            try:
                await Runner.run(agent, f"charge {args.amount} eur", run_config=run_config)
            except ConnectionError:
                if attempt > 0:
                    raise
        # What the model was handed of the charge: its next call's input.
        outputs = [item["output"] for call in model.calls[1:] for item in call.input
                   if isinstance(item, dict) and item.get("type") == "function_call_output"]
        lines.append({"attempt": attempt, "arguments": arguments, "operation": seen.get("operation"),
                      "model_read": text_of(outputs[-1]) if attempt > 0 and outputs else None})
    return lines


async def run_identity():
    lines = await (langgraph_thread() if args.scenario == "langgraph-thread" else openai_group())
    for line in lines:
        print(json.dumps(line, default=str), flush=True)
    return 0 if len(lines) == 2 and all(line["operation"] for line in lines) else 1


async def main():
    failures = 0
    calls = langchain_calls() if args.framework == "langchain" else openai_calls()
    async for invoke in calls:
        for batch in range(args.repeat):
            batch_calls = [Call(i) for i in range(args.calls)]

            async def one(call):
                try:
                    await invoke(call)
                    return None
                except Exception as error:  # noqa: BLE001 - reported per call
                    return error

            errors = await asyncio.gather(*(one(c) for c in batch_calls))
            for call, error in zip(batch_calls, errors):
                ok = error is None and not call.is_error
                failures += not ok
                text = None if error is None else describe(error)
                if error is None and call.is_error:
                    text = "isError result"
                line = {"batch": batch, "call": call.index, "ok": ok,
                        "error_code": None if error is None else error_code(error),
                        "error": text, "operation": call.note}
                print(json.dumps(line, default=str), flush=True)
    return failures


def timed_out():
    # A hung transport teardown must not hold the suite: leave at once.
    print(json.dumps({"timeout": DEADLINE}), file=sys.stderr, flush=True)
    sys.stdout.flush()
    os._exit(2)


watchdog = threading.Timer(DEADLINE, timed_out)
watchdog.daemon = True
watchdog.start()
failed = asyncio.run(main() if args.scenario is None else run_identity())
sys.stdout.flush()
os._exit(1 if failed else 0)
