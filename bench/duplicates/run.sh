#!/usr/bin/env bash
# The duplicate-effect benchmark with its pinned clients: makes (once per pin
# change) the virtual environment target/duplicates-venv from
# bench/duplicates/requirements.txt, then runs duplicates.py in it with the
# arguments given (`--help` lists them), after installing the pinned mcp-proxy
# once. Needs `cargo build --release --bins` first (the full run's binaries; the
# debug build runs when there is no release build).
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
# mcp-proxy from crates.io, pinned, built once into target/mcp-proxy (several
# CPU-minutes); DUPLICATES_MCP_PROXY=0 skips it (then leave out its path).
if [ "${DUPLICATES_MCP_PROXY:-1}" != 0 ] && [ ! -x "$root/target/mcp-proxy/bin/mcp-proxy" ]; then
    cargo install mcp-proxy --locked --version 0.4.3 --root "$root/target/mcp-proxy" \
        --target-dir "$root/target/mcp-proxy-build"
fi
exec "$venv/bin/python" "$root/bench/duplicates/duplicates.py" "$@"
