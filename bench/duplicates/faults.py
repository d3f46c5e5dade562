"""The fault injector of the duplicate-effect benchmark: HTTP proxies between
the agent and its entry point (client side) and between the entry point and
each tool server (tool side), and the supervisor of the tool servers.

Run by `duplicates.py` as a process of its own (so that it has a core of its
own next to the agents): `python faults.py CONFIG.json`. It prints one line
`ready` when every listener is bound and every tool server answers.

Each proxy forwards one request per connection (`Connection: close` both
ways) and relays the answer byte for byte. A fault is looked up by the
intent label the request's body names (`dupbench-NNNNNN`, a string of its
own or an address's local part) and applies to the first `tools/call` of
that intent reaching that proxy only, so every path sees the same faults at
the same intents whatever it sends after:

- `cut` (client side): the request is forwarded, the whole answer is read
  (the tool acted), and the agent's connection is closed without a byte;
- `slow` (tool side): the answer is held `slow_ms` before it is relayed
  (past the agent's timeout);
- `crash` (tool side): the answer is read, the tool server is SIGKILLed
  before a byte reaches its caller, and it is started again.

Every injected fault is a line of `<state>/injected.jsonl`.
"""

import asyncio
import json
import os
import re
import signal
import sys
import time

LABEL = re.compile(rb'"(dupbench-\d{6})["@]')


class ToolServer:
    """One example tool server over Streamable HTTP, restarted when it dies."""

    def __init__(self, spec, state):
        self.command = spec["command"]
        self.port = spec["port"]
        self.name = spec["name"]
        self.state = state
        self.process = None
        self.restarts = 0
        self.lock = asyncio.Lock()
        # Set by stop(): from then on nothing restarts the server.
        self.stopping = False

    async def start(self):
        log = open(os.path.join(self.state, f"tools-{self.name}.log"), "ab")
        self.process = await asyncio.create_subprocess_exec(
            *self.command, stdin=asyncio.subprocess.DEVNULL, stdout=log, stderr=log
        )
        await wait_port(self.port, 30.0)

    async def crash_and_restart(self):
        async with self.lock:
            if self.process and self.process.returncode is None:
                self.process.send_signal(signal.SIGKILL)
                await self.process.wait()
            if self.stopping:
                return
            self.restarts += 1
            await self.start()

    async def supervise(self):
        while True:
            await asyncio.sleep(0.2)
            async with self.lock:
                if self.stopping:
                    return
                if self.process and self.process.returncode is not None:
                    self.restarts += 1
                    await self.start()

    async def stop(self):
        """Ends the server for good (SIGTERM, then SIGKILL after 5 s); the
        supervisor and a crash fault in progress restart it no more."""
        async with self.lock:
            self.stopping = True
            if self.process and self.process.returncode is None:
                self.process.send_signal(signal.SIGTERM)
                try:
                    await asyncio.wait_for(self.process.wait(), 5)
                except asyncio.TimeoutError:
                    self.process.kill()
                    await self.process.wait()


async def wait_port(port, deadline):
    end = time.monotonic() + deadline
    while time.monotonic() < end:
        try:
            _, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.close()
            return
        except OSError:
            await asyncio.sleep(0.05)
    raise RuntimeError(f"nothing listens on 127.0.0.1:{port} after {deadline} s")


def close_header(head):
    """The head with its Connection header replaced by `Connection: close`."""
    lines = head.split(b"\r\n")
    kept = [line for line in lines[1:] if line and not line.lower().startswith(b"connection:")]
    return b"\r\n".join([lines[0], *kept, b"Connection: close"]) + b"\r\n\r\n"


class Proxy:
    def __init__(self, spec, plan, servers, injected, slow_ms):
        self.listen = spec["listen"]
        self.upstream = spec["upstream"]
        self.role = spec["role"]
        self.server = servers.get(spec.get("server"))
        self.effect_tools = set(spec.get("effect_tools", []))
        self.plan = plan
        self.injected = injected
        self.slow_ms = slow_ms
        self.seen = set()

    def fault_for(self, body):
        if b'"tools/call"' not in body:
            return None, None
        match = LABEL.search(body)
        if not match:
            return None, None
        label = match.group(1).decode()
        try:
            name = json.loads(body).get("params", {}).get("name", "")
        except (ValueError, AttributeError):
            name = ""
        if self.effect_tools and name.split("__")[-1] not in self.effect_tools:
            return None, None
        if label in self.seen:
            return None, label
        self.seen.add(label)
        fault = self.plan.get(label, {}).get(self.role)
        return fault, label

    async def handle(self, reader, writer):
        upstream_writer = None
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            length = 0
            for line in head.split(b"\r\n")[1:]:
                if line.lower().startswith(b"content-length:"):
                    length = int(line.split(b":", 1)[1])
            body = await reader.readexactly(length) if length else b""
            fault, label = self.fault_for(body)
            upstream_reader, upstream_writer = await asyncio.open_connection(*self.upstream)
            upstream_writer.write(close_header(head) + body)
            await upstream_writer.drain()
            if fault is None:
                await self.relay(upstream_reader, writer)
                return
            answer = await asyncio.wait_for(upstream_reader.read(-1), 60.0)
            self.injected.write(json.dumps({"label": label, "fault": fault, "role": self.role,
                                            "at": time.time(), "answer_bytes": len(answer)}) + "\n")
            self.injected.flush()
            if fault == "slow":
                await asyncio.sleep(self.slow_ms / 1000)
                writer.write(rewrite_answer(answer))
                await writer.drain()
            elif fault == "crash" and self.server is not None:
                await self.server.crash_and_restart()
            # `cut` (and `crash`): the agent's connection ends without a byte.
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, asyncio.TimeoutError):
            pass
        finally:
            if upstream_writer is not None:
                upstream_writer.close()
            writer.close()

    async def relay(self, upstream_reader, writer):
        head = await upstream_reader.readuntil(b"\r\n\r\n")
        writer.write(close_header(head))
        while True:
            chunk = await upstream_reader.read(65536)
            if not chunk:
                break
            writer.write(chunk)
            await writer.drain()


def rewrite_answer(answer):
    at = answer.find(b"\r\n\r\n")
    if at < 0:
        return answer
    return close_header(answer[: at + 4]) + answer[at + 4:]


async def main(path):
    with open(path) as file:
        config = json.load(file)
    state = config["state"]
    plan = config["plan"]
    injected = open(os.path.join(state, "injected.jsonl"), "a")
    servers = {}
    for spec in config["servers"]:
        server = ToolServer(spec, state)
        await server.start()
        servers[spec["name"]] = server
        asyncio.get_running_loop().create_task(server.supervise())
    listeners = []
    for spec in config["proxies"]:
        proxy = Proxy(spec, plan, servers, injected, config["slow_ms"])
        host, port = spec["listen"]
        listeners.append(await asyncio.start_server(proxy.handle, host, port, limit=1 << 22, backlog=512))
    print("ready", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    for server in servers.values():
        await server.stop()
    with open(os.path.join(state, "restarts.json"), "w") as file:
        json.dump({name: s.restarts for name, s in servers.items()}, file)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
