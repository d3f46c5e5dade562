"""Answers the official Python SDK received for requests it no longer waits
on, such as leasegate's `-32800` to a cancelled call.

A handshake-era client keeps a cancelled request's stream open, and
leasegate answers it at once. If the client closes while that answer is on
its way, the SDK's own teardown fails (its transport task raises
BrokenResourceError into the client's task group): an SDK race, not a
leasegate fault. The SDK only logs such answers, at debug level; this
module counts those log records so that a script can wait for the answer
before it closes the client.
"""

import logging

_DROPPED = ("dropping response for unknown/late request id", "waiter for request id")

received = 0


class _Counter(logging.Handler):
    def emit(self, record):
        global received
        if isinstance(record.msg, str) and record.msg.startswith(_DROPPED):
            received += 1


_log = logging.getLogger("mcp.shared.jsonrpc_dispatcher")
_log.setLevel(logging.DEBUG)
_log.addHandler(_Counter())
_log.propagate = False
