"""The checks the SDK scripts (bearer.py, transparency.py) make: one JSON
line per check on stdout, and the count of those that failed, which the
script's exit status reports."""

import json

failures = 0


def report(check, ok, detail=None):
    """Prints one check's outcome as a JSON line; counts it if it failed."""
    global failures
    if not ok:
        failures += 1
    print(json.dumps({"check": check, "ok": bool(ok), "detail": detail}, default=str), flush=True)
