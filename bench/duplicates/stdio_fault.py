"""The duplicate-effect benchmark's stdio fault point: a stdio tool server
that is killed after it acted.

    python stdio_fault.py CONFIG.json -- COMMAND [ARG...]

Whoever spawns a stdio tool server — the agent on the direct paths, the
gateway (leasegate's stdio upstream, mcp-proxy's stdio backend) — spawns
this in its place. It starts COMMAND (the example tool server over stdio)
and relays its stdin and stdout line by line. The first call of the
side-effecting tool (`effect_tools`) for an intent the plan in CONFIG.json
dooms (`kill`, by its label `dupbench-NNNNNN`), whichever process of
whichever path delivers it, is forwarded; once the tool's answer to it is
read (the tool acted), the tool server is SIGKILLed and this process kills
itself the same way, before a byte of that answer reaches the caller: to
the caller, the stdio server died with the call in flight, as a crashed
server does (and so did every other call in flight on it). Which intents
were delivered is kept across processes as one file per label under
`<state>/stdio-seen/` (created exclusively), so a restarted server or a
re-issue never meets the fault again; a query naming the intent (the
reconciler's `get_bucket`) is no delivery.

Every kill is a line of `<state>/injected.jsonl`, as the HTTP fault points'.
"""

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time

LABEL = re.compile(rb'"(dupbench-\d{6})"')


def first_delivery(seen, label):
    try:
        os.close(os.open(os.path.join(seen, label), os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        return True
    except FileExistsError:
        return False


def main():
    separator = sys.argv.index("--")
    with open(sys.argv[1]) as file:
        config = json.load(file)
    command = sys.argv[separator + 1:]
    doomed_labels = set(config["kill"])
    effect_tools = set(config["effect_tools"])
    seen = os.path.join(config["state"], "stdio-seen")
    os.makedirs(seen, exist_ok=True)
    child = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    # The request ids (as JSON text) whose answer ends the server, and their labels.
    doomed = {}
    lock = threading.Lock()

    def pump_in():
        try:
            for line in sys.stdin.buffer:
                match = LABEL.search(line) if b'"tools/call"' in line else None
                label = match.group(1).decode() if match else None
                if label in doomed_labels:
                    request = json.loads(line)
                    # The side-effecting tool's call, not a query naming the same intent.
                    if request.get("params", {}).get("name") in effect_tools \
                            and first_delivery(seen, label):
                        with lock:
                            doomed[json.dumps(request.get("id"))] = label
                child.stdin.write(line)
                child.stdin.flush()
        except (OSError, ValueError):
            pass
        finally:
            # The caller closed our stdin: the tool server's ends too, and it exits.
            try:
                child.stdin.close()
            except OSError:
                pass

    threading.Thread(target=pump_in, daemon=True).start()
    out = sys.stdout.buffer
    for line in child.stdout:
        if doomed and b'"id"' in line:
            try:
                answer = json.loads(line)
            except ValueError:
                answer = {}
            key = json.dumps(answer.get("id")) if isinstance(answer, dict) else None
            with lock:
                label = doomed.pop(key, None) if ("result" in answer or "error" in answer) else None
            if label is not None:
                with open(os.path.join(config["state"], "injected.jsonl"), "a") as log:
                    log.write(json.dumps({"label": label, "fault": "kill", "role": "stdio",
                                          "at": time.time(), "answer_bytes": len(line)}) + "\n")
                child.kill()
                child.wait()
                os.kill(os.getpid(), signal.SIGKILL)
        out.write(line)
        out.flush()
    sys.exit(child.wait())


if __name__ == "__main__":
    main()
