"""The duplicate-effect benchmark: what retries do to real side effects.

    python bench/duplicates/duplicates.py --intents 2000 --agents 48 --seed 7 [--paths direct,resilient,mcp-proxy,explicit,session,key]
    python bench/duplicates/duplicates.py --retry replan --intents 2000 --agents 48 --seed 7

(`bench/duplicates/run.sh` makes its pinned virtual environment first.)

Runs the same workload, under the same seeded faults, through each path and
counts the side effects the tool servers recorded:

- `direct`: the agent straight to the tool servers;
- `resilient`: the agent through `mcp-resilient`'s `@mcp_reliable` retry
  (its defaults: 3 attempts, decorrelated jitter; its per-attempt timeout set
  to the agent's, its circuit breaker off so that every call is tried);
- `mcp-proxy`: the agent through `mcp-proxy` (crates.io) with its retry and
  request coalescing on;
- `explicit`, `session`, `key`: the agent through `leasegate serve` in each
  lease mode.

The agents are the official MCP Python SDK's `Client`, half of them in its
default mode (MCP 2026-07-28 when the server offers it) and half in
`mode="legacy"` (the `initialize` handshake). Every agent applies the retry
an agent framework applies (except on `resilient`, where the wrapper's own
retry is the only one): a call that times out or whose stream breaks, or
that ends in a JSON-RPC error, is issued again as a new request with a new
request id on a new client, up to `--attempts` times. The tools are the
example tool server's four, one per capability (`charge`: provider
idempotency key; `create_bucket`: resource id + query; `submit_job`:
operation query; `send_email`: none) over Streamable HTTP, and
`create_bucket` once more from a server over stdio (`storage`, every fifth
intent), spawned by its caller; every effect is a line in its state dir.
`faults.py` injects the per-intent faults on HTTP, `stdio_fault.py` the
stdio kill; this script kills and restarts the proxy process and
terminates leasegate's database backends at seeded points of the burst.

With `--retry replan` the agent is a re-planning one: its scripted model
answers every timeout, cut stream or error by planning the call again (a new
tool-call id, so a new key; the key argument re-minted; the free-text field
reworded; an optional field added), and its tasks mix in legitimate calls
that look alike (the same tool, another recipient, amount or name). The
leasegate paths then run in lease modes `session` (a task key per agent
task) and `key` (a new key per model turn, the task key beside it), each
with today's adapters and with `identity` declared (`<mode>-identity`:
`adapters/identity/`), and the table adds the false holds (a legitimate
call answered from another call, or shown and not sent) and the calls shown
and not sent.

Prints the table (paths × counts) and writes `summary.json` and `table.md`
under `--out`. Exit 1 if a leasegate path (with `--retry replan`: one with
`identity` declared) shows a duplicate effect, a lost intent, a wrong
answer, an unknown neither converged nor listed for an operator or a false
hold; 2 if the benchmark could not run.
"""

import argparse
import asyncio
import contextlib
import json
import os
import platform
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
import warnings

import httpx2
from mcp import Client
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client

warnings.simplefilter("ignore")

MCP_PROXY_PATH = "/"
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
LEASE_MODES = ("explicit", "session", "key")
# A leasegate path is a lease mode, with today's adapters or (`-identity`)
# with each tool's identity fields declared.
IDENTITY_PATHS = tuple(f"{mode}-identity" for mode in LEASE_MODES)
LEASEGATE_PATHS = (*LEASE_MODES, *IDENTITY_PATHS)
ALL_PATHS = ("direct", "resilient", "mcp-proxy", *LEASEGATE_PATHS)
DEFAULT_PATHS = {"reissue": ("direct", "resilient", "mcp-proxy", *LEASE_MODES),
                 "replan": ("direct", "resilient", "mcp-proxy", "session", "key",
                            "session-identity", "key-identity")}
# The intents' kinds: the four tools over Streamable HTTP, and `create_bucket`
# once more from a tool server over stdio (`storage`), the one a stdio kill hits.
KINDS = ("charge", "create_bucket", "submit_job", "send_email", "stdio_bucket")
STDIO_KINDS = ("stdio_bucket",)
TOOL_OF = {"charge": "charge", "create_bucket": "create_bucket", "submit_job": "submit_job",
           "send_email": "send_email", "stdio_bucket": "create_bucket"}
CAPABILITY = {"charge": "idempotency_key", "create_bucket": "resource_id",
              "submit_job": "operation_query", "send_email": "none", "stdio_bucket": "resource_id"}
SERVER_OF = {"charge": "payments", "send_email": "mailer", "create_bucket": "provisioner",
             "submit_job": "jobs", "stdio_bucket": "storage"}
# The HTTP tool servers (`--tools` of the example tool server: themselves).
HTTP_SERVERS = ("payments", "mailer", "provisioner", "jobs")
EFFECTS_FILES = ("charges.jsonl", "buckets.jsonl", "jobs.jsonl", "emails.jsonl")


def built(name):
    """A binary of this checkout: the release build when there is one (what
    the full run measures), else the debug build."""
    release = os.path.join(ROOT, "target/release", name)
    return release if os.path.exists(release) else os.path.join(ROOT, "target/debug", name)


parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
parser.add_argument("--intents", type=int, default=2000, help="intended calls per path")
parser.add_argument("--agents", type=int, default=16, help="concurrent agents per path")
parser.add_argument("--seed", type=int, default=7)
parser.add_argument("--paths", default=None,
                    help=f"of {', '.join(ALL_PATHS)} (default: {', '.join(DEFAULT_PATHS['reissue'])}; "
                         f"with --retry replan: {', '.join(DEFAULT_PATHS['replan'])})")
parser.add_argument("--retry", choices=("reissue", "replan"), default="reissue",
                    help="what the agent does after a timeout, a cut stream or an error: issue the same "
                         "call again (a framework's retry) or have its model plan the call again")
parser.add_argument("--look-alikes", type=float, default=0.5,
                    help="with --retry replan: share of tasks whose second call looks like the first "
                         "(the same tool, another recipient, amount or name)")
parser.add_argument("--timeout", type=float, default=5.0, help="the agent's timeout per call, seconds")
parser.add_argument("--attempts", type=int, default=4, help="calls per intent, the first included")
parser.add_argument("--cut", type=float, default=0.08, help="share of intents whose first answer stream is cut")
parser.add_argument("--crash", type=float, default=0.04, help="share whose tool server dies after the effect")
parser.add_argument("--slow", type=float, default=0.06, help="share whose tool answers past the agent's timeout")
parser.add_argument("--stdio-kill", type=float, default=0.05,
                    help="share of the stdio tool's intents whose first delivery kills the stdio server after it acted")
parser.add_argument("--proxy-kills", type=int, default=-1, help="leasegate SIGKILL+restart (default: 1 per 500 intents, at least 1)")
parser.add_argument("--db-terminations", type=int, default=-1, help="pg_terminate_backend rounds (default as kills)")
parser.add_argument("--settle", type=float, default=90.0, help="seconds the unknowns get to converge or reach an operator")
parser.add_argument("--leasegate", default=built("leasegate"),
                    help="the leasegate binary (default: target/release's, else target/debug's)")
parser.add_argument("--mcp-proxy", default=os.path.join(ROOT, "target/mcp-proxy/bin/mcp-proxy"),
                    help="the mcp-proxy binary (`run.sh` installs the pinned one)")
parser.add_argument("--tools", default=built("leasegate-example-tools"),
                    help="the example tool server (default: target/release's, else target/debug's)")
parser.add_argument("--admin-url", default=os.environ.get("DUPLICATES_ADMIN_URL", "postgres://postgres@127.0.0.1:5432/postgres"))
parser.add_argument("--out", default=None, help="where the work dirs, summary.json and table.md go (default: a temp dir)")
parser.add_argument("--keep", action="store_true", help="keep the databases")
args = parser.parse_args()


PORTS = random.Random(os.getpid())
HANDED_OUT = set()


def free_port():
    """A port nothing listens on, below the kernel's ephemeral range: a port
    the kernel hands out (bind to 0) may be taken by one of the burst's own
    outgoing connections before the process it is meant for binds it."""
    low = 32768
    with contextlib.suppress(OSError, ValueError), open("/proc/sys/net/ipv4/ip_local_port_range") as file:
        low = int(file.read().split()[0])
    while True:
        port = PORTS.randrange(max(1024, low - 12000), low)
        if port in HANDED_OUT:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            HANDED_OUT.add(port)
            return port


def log(message):
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------- the schedule

def make_schedule():
    """The workload and the faults, from the seed alone: the same on every
    path. The intents come in tasks, each run by one agent in order: one
    intent each, or with `--retry replan` a share of them followed by a
    look-alike (the same tool and words, another recipient, amount or name)."""
    rng = random.Random(args.seed)
    shapes = random.Random(f"tasks-{args.seed}")
    intents, tasks, plan = [], [], {}
    for i in range(args.intents):
        label = f"dupbench-{i:06d}"
        if args.retry == "reissue":
            kind = KINDS[i % len(KINDS)]
            tasks.append([i])
        elif tasks and len(tasks[-1]) == 1 and shapes.random() < args.look_alikes:
            kind = intents[tasks[-1][0]]["kind"]
            tasks[-1].append(i)
        else:
            kind = KINDS[len(tasks) % len(KINDS)]
            tasks.append([i])
        draw = rng.random()
        fault = None
        if kind in STDIO_KINDS:
            # No HTTP between the caller and a stdio server: its fault is the kill.
            if draw < args.stdio_kill:
                fault = {"stdio": "kill"}
        elif draw < args.cut:
            fault = {"client": "cut"}
        elif draw < args.cut + args.crash:
            fault = {"tool": "crash"}
        elif draw < args.cut + args.crash + args.slow:
            fault = {"tool": "slow"}
        if fault:
            plan[label] = fault
        if args.retry == "reissue":
            intents.append({"index": i, "kind": kind, "label": label, "arguments": arguments(kind, i, label)})
        else:
            task = len(tasks) - 1
            intents.append({"index": i, "kind": kind, "label": label, "task": task,
                            "look_alike": len(tasks[-1]) > 1, "arguments": planned_arguments(kind, i, label, task)})
    kills = args.proxy_kills if args.proxy_kills >= 0 else max(1, args.intents // 500)
    terminations = args.db_terminations if args.db_terminations >= 0 else max(1, args.intents // 500)
    points = rng.sample(range(args.intents // 10, args.intents * 9 // 10 or 1), kills + terminations)
    process = sorted([(p, "proxy_kill") for p in points[:kills]] + [(p, "db_terminate") for p in points[kills:]])
    return intents, tasks, plan, process


def arguments(kind, i, label):
    if kind == "charge":
        # The amount names the intent in charges.jsonl; the memo names it in the request.
        return {"amount": 100000 + i, "currency": "eur", "memo": label}
    if kind in ("create_bucket", "stdio_bucket"):
        # The agent names its bucket, as `create_bucket(name="invoices-2026")` does.
        return {"name": label, "region": ["eu", "us", "ap"][i % 3], "size": 1 + i % 7}
    if kind == "submit_job":
        return {"name": label, "job_id": label}
    return {"to": f"{label}@bench.test", "subject": label, "body": "duplicate-effect benchmark"}


def planned_arguments(kind, i, label, task):
    """A re-planning agent's first call: the intent's label in the field that
    makes it this effect (the recipient, the order and its amount, the name),
    the task's words in the others, so that a task's look-alike differs from
    its first call there alone."""
    if kind == "charge":
        return {"amount": 100000 + i, "currency": "eur", "customer": f"cus_{task:06d}", "order": label,
                "memo": f"Order of customer cus_{task:06d}"}
    if kind in ("create_bucket", "stdio_bucket"):
        return {"name": label, "region": ["eu", "us", "ap"][task % 3], "size": 1 + task % 7,
                "description": f"Invoices of team {task}"}
    if kind == "submit_job":
        return {"name": label, "job_id": label, "note": f"Nightly export of team {task}"}
    return {"to": f"{label}@bench.test", "subject": f"Invoice INV-{task:06d}", "body": "Your invoice is attached."}


# What the model changes when it plans a call again: the free-text field it
# rewords, and the optional field it adds.
FREE_TEXT = {"charge": "memo", "send_email": "body", "create_bucket": "description",
             "stdio_bucket": "description", "submit_job": "note"}
REWORDINGS = ("{text}", "Re: {text}", "{text} Thank you.", "As discussed: {text}")
OPTIONAL_FIELD = {"charge": ("statement_descriptor", "BENCH ORDER"), "send_email": ("reply_to", "desk@bench.test"),
                  "create_bucket": ("versioning", True), "stdio_bucket": ("versioning", True),
                  "submit_job": ("priority", "high")}


def replanned(intent, turn):
    """The call as the model plans it on its `turn`-th try (0: the first): a
    new tool-call id (its key in lease mode `key`) and the key argument
    minted anew every time, as a model does; from the second try on the
    free-text field reworded and an optional field added."""
    kind = intent["kind"]
    planned = dict(intent["arguments"])
    if kind == "charge":
        planned["idempotency_key"] = f"model-{uuid.uuid4().hex[:16]}"
    text = FREE_TEXT[kind]
    planned[text] = REWORDINGS[turn % len(REWORDINGS)].format(text=planned[text])
    if turn:
        field, value = OPTIONAL_FIELD[kind]
        planned[field] = value
    return {**intent, "arguments": planned, "key": f"call-{uuid.uuid4().hex}"}


def effects_per_label(state):
    counts = {}
    for file in EFFECTS_FILES:
        path = os.path.join(state, file)
        if not os.path.exists(path):
            continue
        with open(path) as lines:
            for line in lines:
                try:
                    effect = json.loads(line)
                except ValueError:
                    continue
                if file == "charges.jsonl":
                    label = f"dupbench-{int(effect.get('amount', 0)) - 100000:06d}"
                elif file == "emails.jsonl":
                    # The recipient names the intent (with --retry replan a
                    # task's look-alike shares the subject).
                    label = (effect.get("to") or "").split("@")[0]
                else:
                    label = effect.get("name")
                counts[label] = counts.get(label, 0) + 1
    return counts


# ---------------------------------------------------------------- processes

def spawn_ready(name, command, work, ready_url):
    """Starts a proxy process (its output in `<work>/<name>.log`) and waits,
    up to 60 s, until `ready_url` answers."""
    out = open(os.path.join(work, f"{name}.log"), "ab")
    process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=out, stderr=out, cwd=work,
                               env={**os.environ, "RUST_LOG": "warn"})
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{name} exited at start; see {work}/{name}.log")
        try:
            with urllib.request.urlopen(ready_url, timeout=2):
                return process
        except OSError:
            time.sleep(0.1)
    process.kill()
    raise RuntimeError(f"{name} did not answer within 60 s")


def lease_mode(path):
    """The lease mode a leasegate path serves in; None for the other paths."""
    return path.removesuffix("-identity") if path in LEASEGATE_PATHS else None


class Leasegate:
    def __init__(self, work, path, tool_ports, stdio_servers):
        self.work = work
        mode = lease_mode(path)
        self.mcp_port, self.control_port = free_port(), free_port()
        self.database = f"leasegate_dupbench_{path.replace('-', '_')}_{os.getpid()}"
        base = args.admin_url.rsplit("/", 1)[0]
        self.database_url = f"{base}/{self.database}"
        self.process = None
        os.makedirs(os.path.join(work, "adapters"), exist_ok=True)
        # The five tool servers' adapter files, upstream timeout 5 s; on an
        # `-identity` path the same files with each tool's identity declared.
        adapters = os.path.join(HERE, "adapters", "identity") if path in IDENTITY_PATHS \
            else os.path.join(HERE, "adapters")
        for name in os.listdir(adapters):
            if name.endswith(".toml"):
                shutil.copy(os.path.join(adapters, name), os.path.join(work, "adapters", name))
        with open(os.path.join(work, "policy.toml"), "w") as file:
            # A re-issue waiting for its first call hears "in flight, call
            # again" well before the agent's own timeout: the wait is half of
            # it, the other half the agent's connect and the answer's way
            # back (a wait of three quarters left agents on a loaded machine
            # timing out while leasegate was about to answer).
            file.write(POLICY.format(in_flight_ms=int(min(args.timeout * 500, 5000))))
        upstreams = "".join(
            f'[upstreams.{name}]\ntransport = "streamable_http"\nurl = "http://127.0.0.1:{port}/mcp"\n\n'
            for name, port in tool_ports.items())
        # The stdio tool server: leasegate's child, restarted by its supervisor.
        upstreams += "".join(
            f'[upstreams.{name}]\ntransport = "stdio"\ncommand = {json.dumps(command[0])}\n'
            f'args = {json.dumps(command[1:])}\n\n'
            for name, command in stdio_servers.items())
        self.config = os.path.join(work, "leasegate.toml")
        with open(self.config, "w") as file:
            file.write(
                f'database_url = "{self.database_url}"\ndatabase_max_connections = 8\n'
                f'listen = "127.0.0.1:{self.mcp_port}"\ncontrol_listen = "127.0.0.1:{self.control_port}"\n'
                f'adapters = "adapters"\npolicy = "policy.toml"\nmigrate = true\nlease_mode = "{mode}"\n\n'
                f'[limits]\nrate_limit = 0\n\n'
                # A killed process's share of a session lease lapses within
                # the agent's retry budget (the shortest ttl allowed).
                f'[session]\nttl = "3s"\n\n{upstreams}')

    def create_database(self):
        psql(args.admin_url, f'DROP DATABASE IF EXISTS "{self.database}" WITH (FORCE)')
        psql(args.admin_url, f'CREATE DATABASE "{self.database}"')

    def drop_database(self):
        psql(args.admin_url, f'DROP DATABASE IF EXISTS "{self.database}" WITH (FORCE)')

    def start(self):
        self.process = spawn_ready("leasegate", [args.leasegate, "serve", "--config", self.config],
                                   self.work, f"http://127.0.0.1:{self.control_port}/metrics")

    def kill(self):
        if self.process and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait()

    def stop(self):
        if self.process and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                self.kill()

    def control(self, method, path, body=None):
        request = urllib.request.Request(
            f"http://127.0.0.1:{self.control_port}{path}", method=method,
            data=json.dumps(body).encode() if body is not None else None,
            headers={"content-type": "application/json"})
        with urllib.request.urlopen(request, timeout=10) as answer:
            return json.loads(answer.read() or b"null")


class McpProxy:
    """`mcp-proxy` (crates.io) in front of the four tool servers, with its
    per-backend retry on and request coalescing on; killed and restarted
    like leasegate."""

    def __init__(self, work, tool_ports, stdio_servers):
        self.work = work
        self.port = free_port()
        settings = ('[backends.timeout]\nseconds = 5\n'
                    '[backends.retry]\nmax_retries = 3\ninitial_backoff_ms = 100\nmax_backoff_ms = 5000\n\n')
        backends = "".join(
            f'[[backends]]\nname = "{name}"\ntransport = "http"\nurl = "http://127.0.0.1:{port}/mcp"\n{settings}'
            for name, port in tool_ports.items())
        backends += "".join(
            f'[[backends]]\nname = "{name}"\ntransport = "stdio"\ncommand = {json.dumps(command[0])}\n'
            f'args = {json.dumps(command[1:])}\n{settings}'
            for name, command in stdio_servers.items())
        self.config = os.path.join(work, "mcp-proxy.toml")
        with open(self.config, "w") as file:
            file.write(f'[proxy]\nname = "bench"\nseparator = "__"\n[proxy.listen]\nhost = "127.0.0.1"\n'
                       f'port = {self.port}\n\n[performance]\ncoalesce_requests = true\n\n{backends}')
        self.process = None

    def start(self):
        self.process = spawn_ready("mcp-proxy", [args.mcp_proxy, "--config", self.config],
                                   self.work, f"http://127.0.0.1:{self.port}/admin/health")

    kill = Leasegate.kill
    stop = Leasegate.stop


def psql(url, sql):
    out = subprocess.run(["psql", "-X", "-qAt", "-v", "ON_ERROR_STOP=1", url, "-c", sql],
                         capture_output=True, text=True, timeout=60)
    if out.returncode != 0:
        raise RuntimeError(f"psql: {out.stderr.strip()}")
    return out.stdout


POLICY = """lease_ttl_ceiling = "1h"
claim_ttl = "8s"
in_flight_wait = "{in_flight_ms}ms"
dispatch_interval = "250ms"
claim_expiry_interval = "250ms"
reconcile_interval = "500ms"
reconcile_claim_ttl = "10s"
reconcile_retries = 20
"""


# ---------------------------------------------------------------- the agents

@contextlib.asynccontextmanager
async def transport(url, headers):
    timeout = httpx2.Timeout(30.0, read=60.0)
    # Plain HTTP on loopback: no TLS, so no certificate store to load for
    # each client (it cost the agents more CPU than their MCP sessions).
    async with httpx2.AsyncClient(headers=headers, timeout=timeout, verify=False) as http:
        async with streamable_http_client(url, http_client=http) as streams:
            yield streams


class Agent:
    """One agent. Each call opens its own SDK client (a new session, a new
    request id), as an agent re-issuing a call after a failure does."""

    def __init__(self, path, number, entry, task_key, errlog):
        self.lease_mode = lease_mode(path)
        self.errlog = errlog
        self.mode = "auto" if number % 2 == 0 else "legacy"
        self.entry = entry
        # The task key, in lease mode `session`; with --retry replan in mode
        # `key` too, where it scopes a declared identity across the keys a
        # framework mints anew every turn.
        self.task_key = task_key
        self.sends_task = self.lease_mode == "session" or (self.lease_mode == "key" and args.retry == "replan")
        self.phases = {}

    async def once(self, intent, lease):
        """One call: its classified answer, or an exception (timeout, broken
        stream, error). `intent["key"]`, when there, is the call's own key (a
        re-planned call's); else the intent's label is."""
        import anyio
        target, name = self.entry(intent["kind"])
        if isinstance(target, StdioServerParameters):
            # The agent spawns the stdio tool server itself, one per client.
            opened = stdio_client(target, errlog=self.errlog)
        else:
            opened = transport(target, {"Leasegate-Task": self.task_key} if self.sends_task else {})
        meta = None
        if self.lease_mode == "explicit":
            meta = {"dev.leasegate/lease": lease}
        elif self.lease_mode == "key":
            meta = {"dev.leasegate/idempotency_key": intent.get("key", intent["label"])}
        # Where each call's time went (connect, the call, closing), for the
        # records: a call that took longer than the agent's timeout says why.
        phases = self.phases = {}
        begin = time.monotonic()
        marks = {}
        try:
            with anyio.fail_after(args.timeout * 3):
                async with Client(opened, mode=self.mode) as client:
                    marks["called"] = time.monotonic()
                    try:
                        with anyio.fail_after(args.timeout):
                            result = await client.call_tool(name, intent["arguments"], meta=meta)
                    finally:
                        marks["closing"] = time.monotonic()
        finally:
            end = time.monotonic()
            points = [begin, marks.get("called"), marks.get("closing"), end]
            for key, (a, b) in zip(("connect_s", "call_s", "close_s"), zip(points, points[1:])):
                if a is not None and b is not None:
                    phases[key] = round(b - a, 2)
            phases["total_s"] = round(end - begin, 2)
        return classify(result)

    async def close(self):
        pass


def classify(result):
    data = result.model_dump(by_alias=True, exclude_none=True, mode="json")
    meta = data.get("_meta") or {}
    operation = meta.get("dev.leasegate/operation") or {}
    structured = data.get("structuredContent") or {}
    status = operation.get("status") or structured.get("status")
    answer = {"operation_id": operation.get("operation_id") or structured.get("operation_id"),
              "replayed": operation.get("replayed")}
    if operation.get("rephrased"):
        answer["rephrased"] = operation["rephrased"]
    shown = meta.get("dev.leasegate/shown")
    if isinstance(shown, dict) and shown.get("sent") is False:
        # Not sent: an earlier call to the tool has an outcome its agent never
        # received, and the answer shows it (an error result listing it).
        answer["answer"] = "shown"
        answer["shown_operations"] = shown.get("operations") or []
        answer["undelivered"] = structured.get("dev.leasegate/undelivered")
    elif status == "unknown":
        answer["answer"] = "unknown"
        answer["reason"] = structured.get("reason")
    elif data.get("isError"):
        answer["answer"] = "failed"
    else:
        answer["answer"] = "succeeded"
    return answer


def error_code(error):
    code = getattr(getattr(error, "error", None), "code", None)
    return code if code is not None else getattr(error, "code", None)


async def framework_retry(agent, intent, lease, wrapped=False):
    """Re-issue on timeout, broken stream or error, a new request each time:
    the same call (a framework's retry) or, with `--retry replan`, the call as
    the model plans it again, `wrapped` in mcp-resilient's retry on that path."""
    record = {"calls": 0, "errors": []}
    replan = args.retry == "replan"

    async def send(call):
        record["calls"] += 1
        return await agent.once(call, lease)

    if wrapped:
        send = reliable(agent, record, intent["kind"])
    for attempt in range(args.attempts):
        try:
            answer = await send(replanned(intent, attempt) if replan else intent)
        except Exception as error:  # noqa: BLE001 - what the agent does with any failure is the measure
            record.setdefault("phases", []).append(agent.phases)
            record["errors"].append(describe(error))
            code = error_code(leaf(error))
            data = getattr(getattr(leaf(error), "error", None), "data", None)
            if isinstance(data, dict) and data.get("operation_id"):
                record["operation_id"] = data["operation_id"]
            if code == -31011:
                record["answer"] = "not_sent"
            elif code == -31006:
                record["answer"] = "in_flight"
            else:
                record.pop("answer", None)
            if replan:
                record.setdefault("turns", []).append(
                    {"error": code if code is not None else type(leaf(error)).__name__,
                     "operation_id": data.get("operation_id") if isinstance(data, dict) else None})
            await asyncio.sleep(min(1.0, 0.25 * 2 ** attempt))
            continue
        if replan:
            record.setdefault("turns", []).append({key: answer[key] for key in TURN_KEYS if key in answer})
            if answer["answer"] == "shown":
                answer = adopted(answer, intent, record)
                if answer is None:
                    record.setdefault("phases", []).append(agent.phases)
                    record.pop("answer", None)
                    continue
        record.update(answer)
        record.setdefault("phases", []).append(agent.phases)
        return record
    if "answer" not in record:
        record["answer"] = "failed"
        record["gave_up"] = True
    return record


# What a re-planning agent's record keeps of each answered turn.
TURN_KEYS = ("answer", "operation_id", "replayed", "rephrased", "shown_operations", "undelivered")
LABEL = re.compile(r"dupbench-\d{6}")
# A shown call's status as the model takes it for its own call's answer.
ADOPTED = {"succeeded": "succeeded", "dispatching": "in_flight", "prepared": "not_sent"}


def adopted(answer, intent, record):
    """What the model makes of a call leasegate showed instead of sending.
    The earlier call it lists is this intent's own when it names the
    intent's label, or, when the listing names no label, when one of this
    intent's calls went unanswered: then that call's outcome is the answer
    (unknown unless the listing says otherwise; an earlier call that did
    nothing is planned again). Otherwise the model takes note of another
    call's outcome and plans its own call again (None)."""
    listed = answer.get("undelivered")
    entries = listed if isinstance(listed, list) else [listed] if listed else []
    text = json.dumps(listed)
    mine = next((e for e in entries if intent["label"] in json.dumps(e)), None)
    if mine is None and not LABEL.search(text) and any("error" in turn for turn in record.get("turns", [])):
        mine = entries[0] if entries else {}
    if mine is None:
        return None
    status = mine.get("status") if isinstance(mine, dict) else None
    if status in ("failed_final", "cancelled"):
        return None
    operation = (mine.get("operation_id") if isinstance(mine, dict) else None) \
        or next(iter(answer.get("shown_operations") or []), None)
    return {**answer, "answer": ADOPTED.get(status, "unknown"), "operation_id": operation}


def reliable(agent, record, kind):
    """`agent.once` under `mcp-resilient`'s `@mcp_reliable` (its defaults: 3
    attempts, decorrelated jitter; its per-attempt timeout the agent's, its
    circuit breaker off so that every call is tried), each call counted and
    each failure recorded; raises once the wrapper gives up."""
    from mcp_resilient import ReliabilityConfig, mcp_reliable
    from mcp_resilient.core.config import CircuitBreakerConfig, RetryConfig
    config = ReliabilityConfig(
        tool_name=kind,
        retry=RetryConfig(timeout_seconds=args.timeout),
        circuit_breaker=CircuitBreakerConfig(enabled=False))

    @mcp_reliable(config)
    async def send(call):
        record["calls"] += 1
        try:
            return await agent.once(call, None)
        except Exception as error:
            record["errors"].append(describe(error))
            raise

    return send


async def resilient_retry(agent, intent):
    """The wrapper's retry alone: the same call, up to its attempts."""
    record = {"calls": 0, "errors": []}
    try:
        record.update(await reliable(agent, record, intent["kind"])(intent))
    except Exception as error:  # noqa: BLE001
        record["errors"].append("gave up: " + describe(error))
        record["answer"] = "failed"
        record["gave_up"] = True
    return record


def leaf(error):
    """The first exception inside nested exception groups."""
    while isinstance(error, BaseExceptionGroup) and error.exceptions:
        error = error.exceptions[0]
    return error


def describe(error):
    error = leaf(error)
    code = error_code(error)
    text = f"{type(error).__name__}{f' {code}' if code is not None else ''}: {error}"
    return text[:200]


# ---------------------------------------------------------------- one path

async def run_path(path, intents, tasks, plan, process_faults, work):
    os.makedirs(work, exist_ok=True)
    state = os.path.join(work, "state")
    os.makedirs(state, exist_ok=True)
    servers = {name: free_port() for name in HTTP_SERVERS}
    tool_side = {name: free_port() for name in servers}
    # The stdio tool server, as its caller spawns it: through the stdio fault
    # point (stdio_fault.py), which kills it after it acted for a doomed intent.
    stdio_config = os.path.join(work, "stdio-faults.json")
    with open(stdio_config, "w") as file:
        json.dump({"state": state, "kill": [label for label, fault in plan.items() if "stdio" in fault],
                   "effect_tools": sorted({TOOL_OF[k] for k in STDIO_KINDS})}, file)
    stdio_servers = {"storage": [sys.executable, os.path.join(HERE, "stdio_fault.py"), stdio_config, "--",
                                 args.tools, "--tools", "provisioner", "--state-dir", state]}
    faults_config = {
        "state": state, "plan": plan, "slow_ms": int(args.timeout * 1000 + 1500),
        "servers": [{"name": name, "port": port,
                     "command": [args.tools, "--tools", name, "--state-dir", state,
                                 "--http", f"127.0.0.1:{port}"]} for name, port in servers.items()],
        "proxies": [{"listen": ["127.0.0.1", tool_side[name]], "upstream": ["127.0.0.1", port],
                     "role": "tool", "server": name,
                     "effect_tools": sorted({TOOL_OF[k] for k in KINDS if k not in STDIO_KINDS})}
                    for name, port in servers.items()],
    }
    lg = gateway = None
    if path == "mcp-proxy":
        gateway = McpProxy(work, tool_side, stdio_servers)
        entry_port = free_port()
        faults_config["proxies"].append({"listen": ["127.0.0.1", entry_port],
                                         "upstream": ["127.0.0.1", gateway.port], "role": "client"})

        def entry(kind):
            return f"http://127.0.0.1:{entry_port}{MCP_PROXY_PATH}", f"{SERVER_OF[kind]}__{TOOL_OF[kind]}"
    elif path in LEASEGATE_PATHS:
        lg = gateway = Leasegate(work, path, tool_side, stdio_servers)
        entry_port = free_port()
        faults_config["proxies"].append({"listen": ["127.0.0.1", entry_port],
                                         "upstream": ["127.0.0.1", lg.mcp_port], "role": "client"})

        def entry(kind):
            return f"http://127.0.0.1:{entry_port}/mcp", f"{SERVER_OF[kind]}__{TOOL_OF[kind]}"
    else:
        client_side = {name: free_port() for name in servers}
        for name in servers:
            faults_config["proxies"].append({"listen": ["127.0.0.1", client_side[name]],
                                             "upstream": ["127.0.0.1", tool_side[name]], "role": "client"})

        def entry(kind):
            if kind in STDIO_KINDS:
                command = stdio_servers[SERVER_OF[kind]]
                return StdioServerParameters(command=command[0], args=command[1:]), TOOL_OF[kind]
            return f"http://127.0.0.1:{client_side[SERVER_OF[kind]]}/mcp", kind
    config_path = os.path.join(work, "faults.json")
    with open(config_path, "w") as file:
        json.dump(faults_config, file)
    injector = await asyncio.create_subprocess_exec(
        sys.executable, os.path.join(HERE, "faults.py"), config_path,
        stdout=asyncio.subprocess.PIPE, stderr=open(os.path.join(work, "faults.log"), "ab"))
    line = await asyncio.wait_for(injector.stdout.readline(), 60)
    if line.strip() != b"ready":
        raise RuntimeError(f"the fault injector did not start; see {work}/faults.log")

    leases = {}
    # What the stdio tool servers the agents spawn print on stderr.
    stdio_errlog = open(os.path.join(work, "stdio-servers.log"), "a")
    try:
        if gateway:
            if lg:
                lg.create_database()
            gateway.start()
            if lease_mode(path) == "explicit":
                # One run per intent (a task of its own), leased before the burst.
                for intent in intents:
                    made = lg.control("POST", "/v1/runs", {"task_id": f"{intent['label']}-{os.getpid()}",
                                                           "owner": "bench-agent", "ttl_ms": 3_600_000})
                    leases[intent["label"]] = {"run_id": made["run_id"], "owner": "bench-agent",
                                               "epoch": made.get("epoch") or (made.get("lease") or {}).get("epoch") or 1, "token": made["lease_token"]}
        records = [None] * len(intents)
        started = time.monotonic()
        counter = {"next": 0, "started": 0}
        injected_process = []
        # A proxy process is killed on every path that has one; backends
        # terminated where there is a database.
        pending = [f for f in process_faults if (f[1] == "proxy_kill" and gateway) or lg]

        async def process_fault(kind):
            at = time.monotonic() - started
            if kind == "proxy_kill":
                gateway.kill()
                await asyncio.to_thread(gateway.start)
                injected_process.append({"fault": kind, "at_s": round(at, 2)})
            else:
                out = await asyncio.to_thread(
                    psql, args.admin_url,
                    f"SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE datname = '{lg.database}'")
                injected_process.append({"fault": kind, "at_s": round(at, 2), "backends": int(out.strip() or 0)})

        fault_tasks = []

        async def work_loop(number):
            agent = Agent(path, number, entry, f"bench-task-{number}", stdio_errlog)
            try:
                while counter["next"] < len(tasks):
                    task = tasks[counter["next"]]
                    counter["next"] += 1
                    counter["started"] += len(task)
                    while pending and pending[0][0] <= task[0]:
                        fault_tasks.append(asyncio.create_task(process_fault(pending.pop(0)[1])))
                    if args.retry == "replan":
                        # A task key per agent task: its look-alike shares it.
                        agent.task_key = f"bench-task-{intents[task[0]]['task']}"
                    for i in task:
                        intent = intents[i]
                        begin = time.monotonic()
                        if path == "resilient" and args.retry == "reissue":
                            record = await resilient_retry(agent, intent)
                        else:
                            record = await framework_retry(agent, intent, leases.get(intent["label"]),
                                                           wrapped=path == "resilient")
                        record["answered_at"] = time.monotonic()
                        record["latency_s"] = record["answered_at"] - begin
                        records[i] = record
            finally:
                await agent.close()

        progress = asyncio.create_task(report_progress(path, counter, len(intents)))
        first_seen = {}
        watcher = asyncio.create_task(watch(lg, intents, records, first_seen)) if lg else None
        await asyncio.gather(*(work_loop(n) for n in range(args.agents)))
        await asyncio.gather(*fault_tasks)
        progress.cancel()
        if watcher:
            watcher.cancel()
        burst = time.monotonic() - started
        convergence = await settle(lg, intents, records, started, first_seen) if lg else None
    finally:
        if gateway:
            gateway.stop()
        injector.send_signal(signal.SIGTERM)
        await injector.wait()
        stdio_errlog.close()
    effects = effects_per_label(state)
    row = count(path, intents, records, effects, convergence, burst)
    row["process_faults"] = injected_process
    row["tool_faults"] = injected_summary(state)
    with open(os.path.join(state, "restarts.json")) as file:
        row["tool_restarts"] = sum(json.load(file).values())
    with open(os.path.join(work, "records.jsonl"), "w") as file:
        for intent, record in zip(intents, records):
            file.write(json.dumps({"label": intent["label"], "kind": intent["kind"],
                                   "effects": effects.get(intent["label"], 0), **record}) + "\n")
    if lg and not args.keep:
        lg.drop_database()
    return row


async def report_progress(path, counter, total):
    while True:
        await asyncio.sleep(10)
        log(f"{path}: {min(counter['started'], total)}/{total} intents started")


def injected_summary(state):
    summary = {}
    path = os.path.join(state, "injected.jsonl")
    if os.path.exists(path):
        with open(path) as lines:
            for line in lines:
                fault = json.loads(line)["fault"]
                summary[fault] = summary.get(fault, 0) + 1
    return summary


async def watch(lg, intents, records, first_seen):
    """While the burst runs: when each operation answered unknown converges."""
    while True:
        await asyncio.sleep(1.0)
        try:
            rows = await asyncio.to_thread(
                psql, lg.database_url,
                "SELECT operation_id FROM tool_operations WHERE status IN ('succeeded', 'failed_final')")
        except (RuntimeError, subprocess.TimeoutExpired):
            continue
        done = set(rows.split())
        now = time.monotonic()
        for intent, record in zip(intents, records):
            if record and record.get("answer") in ("unknown", "in_flight", "not_sent") \
                    and record.get("operation_id") in done:
                first_seen.setdefault(intent["label"], now)


async def settle(lg, intents, records, started, first_seen):
    """Waits, with a deadline, until every operation an answer named is
    converged (a terminal status) or unknown on the operator's list with its
    reason and no pass of the reconciler still working on it."""
    operation_of, kind_of = {}, {}
    for intent, record in zip(intents, records):
        if record.get("operation_id"):
            operation_of[intent["label"]] = record["operation_id"]
            kind_of[record["operation_id"]] = intent["kind"]
    deadline = time.monotonic() + args.settle
    while True:
        rows = await asyncio.to_thread(psql, lg.database_url,
                                       "SELECT operation_id, status FROM tool_operations")
        statuses = dict(line.split("|", 1) for line in rows.split("\n") if "|" in line)
        now = time.monotonic()
        open_count = 0
        for label, op in operation_of.items():
            status = statuses.get(op)
            if status in ("succeeded", "failed_final"):
                first_seen.setdefault(label, now)
            elif status in ("prepared", "dispatching"):
                open_count += 1
        # Only a `none` tool's unknown waits for an operator by design; the
        # others are the reconciler's until the deadline.
        waiting = [op for op in operation_of.values()
                   if statuses.get(op) == "unknown" and CAPABILITY[kind_of[op]] != "none"]
        if (open_count == 0 and not waiting) or now > deadline:
            break
        await asyncio.sleep(1.0)
    listed = await asyncio.to_thread(operator_list, lg)
    owners = await asyncio.to_thread(operation_labels, lg)
    return {"statuses": statuses, "listed": listed, "first_seen": first_seen, "owners": owners,
            "settled_at": now - started, "open": open_count, "waiting": len(waiting)}


def operation_labels(lg):
    """Each recorded operation's intent: the label its request names."""
    rows = psql(lg.database_url,
                "SELECT operation_id, substring(request_body::text FROM 'dupbench-[0-9]{6}') FROM tool_operations")
    return dict(line.split("|", 1) for line in rows.split("\n") if "|" in line)


def operator_list(lg):
    """The operator's list: `leasegate ops list --status unknown`, each with
    its reason (the evidence `leasegate ops show` prints)."""
    out = subprocess.run([args.leasegate, "ops", "list", "--status", "unknown", "--limit", "1000",
                          "--json", "--database-url", lg.database_url],
                         capture_output=True, text=True, timeout=60)
    listed = {}
    try:
        page = json.loads(out.stdout)
    except ValueError:
        return listed
    for op in page.get("operations", []):
        shown = subprocess.run([args.leasegate, "ops", "show", op["operation_id"], "--json",
                                "--database-url", lg.database_url],
                               capture_output=True, text=True, timeout=60)
        reason = None
        with contextlib.suppress(ValueError, KeyError, IndexError, TypeError):
            evidence = json.loads(shown.stdout)["evidence"]
            last = evidence[-1]
            reason = f"{last['kind']}: {(last.get('body') or {}).get('error') or last.get('outcome')}"
        listed[op["operation_id"]] = {"reason": reason, "tool": op.get("tool_name")}
    return listed


def count(path, intents, records, effects, convergence, burst):
    row = {"path": path, "intended": len(intents), "effects": 0, "duplicates": 0, "lost": 0,
           "unknown": 0, "unknown_with_effect": 0, "not_sent": 0, "told_failed_happened": 0,
           "told_succeeded_did_not": 0, "gave_up_happened": 0, "calls": 0, "burst_s": round(burst, 1)}
    if args.retry == "replan":
        row.update(look_alikes=sum(1 for intent in intents if intent["look_alike"]),
                   **held(intents, records, (convergence or {}).get("owners", {})))
    unknown_labels = []
    for intent, record in zip(intents, records):
        n = effects.get(intent["label"], 0)
        row["effects"] += n
        row["duplicates"] += max(0, n - 1)
        row["calls"] += record["calls"]
        answer = record.get("answer")
        if answer in ("unknown", "in_flight", "not_sent"):
            unknown_labels.append(intent["label"])
        if answer in ("unknown", "in_flight"):
            row["unknown"] += 1
            if n:
                row["unknown_with_effect"] += 1
        elif answer == "not_sent":
            row["not_sent"] += 1
        if n == 0 and answer not in ("unknown", "in_flight", "not_sent"):
            row["lost"] += 1
        if answer == "failed" and n:
            row["told_failed_happened"] += 1
            if record.get("gave_up"):
                row["gave_up_happened"] += 1
        if answer == "succeeded" and not n:
            row["told_succeeded_did_not"] += 1
    row["wrong"] = row["told_failed_happened"] + row["told_succeeded_did_not"]
    if convergence is not None:
        converged, operator, unsettled, wrong_convergence = 0, [], [], 0
        times = []
        by_label = {i["label"]: r for i, r in zip(intents, records)}
        kind_of = {i["label"]: i["kind"] for i in intents}
        for label in unknown_labels:
            record = by_label[label]
            op = record.get("operation_id")
            status = convergence["statuses"].get(op)
            if status in ("succeeded", "failed_final"):
                converged += 1
                seen = convergence["first_seen"].get(label)
                if seen:
                    times.append(max(0.0, seen - record["answered_at"]))
                if (status == "succeeded") != bool(effects.get(label, 0)):
                    wrong_convergence += 1
            elif status == "unknown" and convergence["listed"].get(op, {}).get("reason"):
                listed = convergence["listed"][op]
                operator.append({"label": label, "operation_id": op, "tool": listed["tool"],
                                 "capability": CAPABILITY[kind_of[label]], "reason": listed["reason"],
                                 "effects": effects.get(label, 0)})
            else:
                unsettled.append({"label": label, "operation_id": op, "status": status})
        row["unknown_converged"] = converged
        row["unknown_to_operator"] = len(operator)
        row["unknown_unsettled"] = len(unsettled)
        row["wrong_convergence"] = wrong_convergence
        row["wrong"] += wrong_convergence
        row["converge_max_s"] = round(max(times), 1) if times else 0.0
        row["settled_after_burst_s"] = round(convergence["settled_at"] - burst, 1)
        row["operator_list"] = operator
        row["unsettled"] = unsettled
    return row


def held(intents, records, owners):
    """What became of a re-planning agent's calls that were not sent as
    they came. A call is a false hold when it was shown instead of sent and
    the earlier calls listed are all another intent's, or when its answer
    (a recorded outcome, "in flight") names another intent's operation
    (`owners`: the ledger's operations by the label their request names).
    A call answered `replayed` with its own intent's operation is a re-plan
    answered from its first call."""
    counts = {"false_holds": 0, "shown": 0, "replayed_own": 0}
    for intent, record in zip(intents, records):
        label = intent["label"]
        for turn in record.get("turns", []):
            if turn.get("answer") == "shown":
                counts["shown"] += 1
                counts["false_holds"] += not (label in json.dumps(turn.get("undelivered")) or any(
                    owners.get(op) == label for op in turn.get("shown_operations", [])))
                continue
            owner = owners.get(turn.get("operation_id"))
            if owner is not None and owner != label:
                counts["false_holds"] += 1
            elif owner == label and turn.get("replayed"):
                counts["replayed_own"] += 1
    return counts


# ---------------------------------------------------------------- the report

def versions():
    found = {"python": platform.python_version()}
    for package in ("mcp", "mcp-resilient", "httpx2"):
        try:
            from importlib.metadata import version
            found[package] = version(package)
        except Exception:  # noqa: BLE001 - a package this run does not use
            pass
    for name, binary in (("leasegate", args.leasegate), ("leasegate-example-tools", args.tools),
                         ("mcp-proxy", args.mcp_proxy)):
        if not os.path.exists(binary):
            continue
        out = subprocess.run([binary, "--version"], capture_output=True, text=True)
        found[name] = out.stdout.strip() if out.returncode == 0 else "?"
        found[f"{name}_binary"] = os.path.relpath(binary, ROOT) if binary.startswith(ROOT) else binary
    crates = os.path.join(os.path.dirname(os.path.dirname(args.mcp_proxy)), ".crates.toml")
    if os.path.exists(crates):
        with open(crates) as file:
            # cargo install's record: `"mcp-proxy 0.4.3 (registry+…)" = [...]`
            for line in file:
                if line.startswith('"mcp-proxy '):
                    found["mcp-proxy"] = line.split('"')[1].split(" (")[0]
    found["postgresql"] = psql(args.admin_url, "SHOW server_version").strip()
    found["leasegate_commit"] = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"],
                                               capture_output=True, text=True).stdout.strip()
    return found


def machine():
    cpu = "?"
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as file:
        for line in file:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    memory = "?"
    with contextlib.suppress(OSError), open("/proc/meminfo") as file:
        memory = f"{int(file.readline().split()[1]) / 1024 / 1024:.1f} GiB"
    return {"cpus": os.cpu_count(), "cpu": cpu, "memory": memory, "kernel": platform.release(),
            "load_at_start": os.getloadavg()}


COLUMNS = [("path", "path"), ("intended", "intended"), ("effects", "effects"),
           ("duplicates", "duplicate effects"), ("lost", "lost intents"),
           ("wrong", "wrong answers"), ("told_failed_happened", "told failed, happened"),
           ("gave_up_happened", "of which the agent gave up"), ("told_succeeded_did_not", "told succeeded, did not"), ("unknown", "answered unknown"),
           ("unknown_with_effect", "unknown with effect"), ("not_sent", "answered not sent (pending)"),
           ("unknown_converged", "unknown or not sent, converged"),
           ("unknown_to_operator", "unknown to operator"), ("converge_max_s", "longest convergence (s)"),
           ("calls", "calls sent by the agent"), ("burst_s", "burst (s)")]


# The re-planning agent's table: what each path did with re-planned calls
# and their look-alikes.
REPLAN_COLUMNS = [("path", "path"), ("intended", "intended"), ("look_alikes", "of which look-alikes"),
                  ("effects", "effects"), ("duplicates", "duplicate effects"), ("lost", "lost intents"),
                  ("wrong", "wrong answers"), ("false_holds", "false holds"),
                  ("shown", "calls shown, not sent"), ("replayed_own", "re-plans answered replayed from their first call"),
                  ("unknown", "answered unknown"), ("unknown_to_operator", "unknown to operator"),
                  ("calls", "calls sent by the agent"), ("burst_s", "burst (s)")]


def table(rows, columns):
    lines = ["| " + " | ".join(title for _, title in columns) + " |",
             "|" + "---|" * len(columns)]
    for row in rows:
        lines.append("| " + " | ".join(str(row.get(key, "–")) for key, _ in columns) + " |")
    return "\n".join(lines)


async def main():
    paths = [p for p in args.paths.split(",") if p] if args.paths else list(DEFAULT_PATHS[args.retry])
    for path in paths:
        if path not in ALL_PATHS:
            parser.error(f"unknown path {path!r}; the paths are {', '.join(ALL_PATHS)}")
    for binary in (args.leasegate, args.tools):
        if not os.path.exists(binary):
            print(f"duplicates: {binary} not found: `cargo build --bins`", file=sys.stderr)
            return 2
    out = args.out or tempfile.mkdtemp(prefix="leasegate-duplicates-")
    os.makedirs(out, exist_ok=True)
    intents, tasks, plan, process_faults = make_schedule()
    header = {
        "seed": args.seed, "intents_per_path": args.intents, "agents": args.agents,
        "agent_timeout_s": args.timeout, "attempts": args.attempts,
        "fault_shares": {"cut": args.cut, "crash": args.crash, "slow": args.slow, "stdio_kill": args.stdio_kill},
        "slow_ms": int(args.timeout * 1000 + 1500),
        "faults_planned": {kind: sum(1 for f in plan.values() if kind in f.values()) for kind in ("cut", "crash", "slow", "kill")},
        "process_faults_planned": [{"before_intent": at, "fault": kind} for at, kind in process_faults],
        "versions": versions(), "machine": machine(),
        "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    if args.retry == "replan":
        header.update(retry="replan", tasks=len(tasks), look_alike_share=args.look_alikes,
                      look_alikes=sum(1 for intent in intents if intent["look_alike"]))
    print(json.dumps({"schedule": header}), flush=True)
    rows = []
    begun = time.monotonic()
    for path in paths:
        log(f"{path}: {args.intents} intents")
        row = await run_path(path, intents, tasks, plan, process_faults, os.path.join(out, path))
        rows.append(row)
        print(json.dumps({"row": row}), flush=True)
        log(f"{path}: {row['effects']} effects, {row['duplicates']} duplicates, {row['lost']} lost, "
            f"{row['wrong']} wrong, {row['unknown']} unknown")
    header["total_s"] = round(time.monotonic() - begun, 1)
    with open(os.path.join(out, "summary.json"), "w") as file:
        json.dump({"schedule": header, "rows": rows}, file, indent=2)
    text = table(rows, REPLAN_COLUMNS if args.retry == "replan" else COLUMNS)
    with open(os.path.join(out, "table.md"), "w") as file:
        file.write(text + "\n")
    print(text)
    print(f"results: {out}", file=sys.stderr)
    # Re-planned calls are leasegate's to hold only where a tool's identity is declared.
    judged = IDENTITY_PATHS if args.retry == "replan" else LEASEGATE_PATHS
    broken = [r for r in rows if r["path"] in judged and
              (r["duplicates"] or r["lost"] or r["wrong"] or r.get("unknown_unsettled") or r.get("false_holds"))]
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
