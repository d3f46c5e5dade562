"""Answers the official Python SDK received for requests it no longer
waits on, such as leasegate's `-32800` to a cancelled call.

A handshake-era client keeps a cancelled request's stream open, and
leasegate answers it at once. If the client closes while that answer is on
its way, the SDK's own teardown fails (its transport task raises
BrokenResourceError into the client's task group): an SDK race, not a
leasegate fault. The SDK drops such answers with only a debug log line, so
this module wraps the one place it resolves an answer (pinned SDK version)
and keeps the error codes of those that found no waiter. A script waits for
leasegate's answer before it closes the client.
"""

from mcp.shared.dispatcher import coerce_request_id
from mcp.shared.jsonrpc_dispatcher import JSONRPCDispatcher

# The error code of each answer that arrived with nothing waiting for it
# (None for a result), in arrival order.
codes = []

_resolve = JSONRPCDispatcher._resolve_pending


def _recording(self, request_id, outcome):
    if request_id is None or self._pending.get(coerce_request_id(request_id)) is None:
        codes.append(getattr(outcome, "code", None))
    return _resolve(self, request_id, outcome)


JSONRPCDispatcher._resolve_pending = _recording


def cancelled_answers():
    """How many `-32800` (request cancelled) answers arrived unawaited."""
    return codes.count(-32800)
