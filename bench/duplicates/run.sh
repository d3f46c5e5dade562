#!/usr/bin/env bash
# The duplicate-effect benchmark with its pinned clients: makes (once per pin
# change) the virtual environment target/duplicates-venv from
# bench/duplicates/requirements.txt, then runs duplicates.py in it with the
# arguments given (`--help` lists them). Needs `cargo build --bins` first.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
venv="$root/target/duplicates-venv"
pins="$root/bench/duplicates/requirements.txt"
if ! cmp -s "$pins" "$venv/.pins" 2>/dev/null; then
    rm -rf "$venv"
    python3 -m venv "$venv"
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check -r "$pins"
    cp "$pins" "$venv/.pins"
fi
exec "$venv/bin/python" "$root/bench/duplicates/duplicates.py" "$@"
