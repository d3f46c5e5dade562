// The Vercel AI SDK's MCP client (`@ai-sdk/mcp`) against leasegate, with no
// model. Run by the Rust suite (tests/external/agent_frameworks.rs) with
// `node`; the packages come from target/sdk-node (tests/sdk/package.json),
// named by the environment variable SDK_NODE. The suite counts side effects
// and ledger rows itself; this script uses the client's tools the way the AI
// SDK does (`tools()`, then each tool's `execute` and `toModelOutput`) and
// reports what the model would read:
//
//   vercel.mjs replay --url URL --key KEY
//       The docs/clients.md lines: a charge with an Idempotency-Key, the same
//       again, then one with no key. One JSON line per call:
//       {"call": "first"|"again", "model_read"} and
//       {"call": "unkeyed", "error_code", "error"} (the AI SDK hands the model
//       a failed tool's error message); then a charge under KEY-unknown that
//       hangs past the tool's timeout: {"call": "unknown", "model_read"}.
//
//   vercel.mjs sigterm --stdio-command JSON_ARGV --charges FILE --amount N
//       Spawns JSON_ARGV (`leasegate stdio --task …`) through the SDK's stdio
//       transport, starts a charge of N that hangs after charging, waits for
//       FILE to record it, and closes the client, which ends the child with
//       SIGTERM. Prints {"pid"} before closing and {"closed": true} after.
//
// Exits 0 when the scenario ran to its report, 2 when the 60 s deadline passed.

import { createRequire } from 'node:module';
import { existsSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { pathToFileURL } from 'node:url';

const DEADLINE_MS = 60_000;
setTimeout(() => {
  console.error(JSON.stringify({ timeout: DEADLINE_MS }));
  process.exit(2);
}, DEADLINE_MS).unref();

const packages = createRequire(join(process.env.SDK_NODE, 'package.json'));
const load = async (name) => import(pathToFileURL(packages.resolve(name)).href);
const { createMCPClient } = await load('@ai-sdk/mcp');

const [scenario, ...rest] = process.argv.slice(2);
const option = (name) => {
  const at = rest.indexOf(`--${name}`);
  return at < 0 ? undefined : rest[at + 1];
};
const report = (line) => console.log(JSON.stringify(line));

// What the AI SDK gives the model for a tool's output.
const modelRead = (tool, output) =>
  tool.toModelOutput({ toolCallId: 'call-1', input: {}, output });

async function replay() {
  const url = option('url');
  // docs/clients.md, Vercel AI SDK: these lines as written there.
  let key; // the Idempotency-Key of the call being made
  const client = await createMCPClient({
    transport: {
      type: 'http',
      url,
      fetch: (input, init) => {
        const headers = new Headers(init?.headers);
        if (key) headers.set('Idempotency-Key', key);
        return fetch(input, { ...init, headers });
      },
    },
  });
  const tools = await client.tools();
  const charge = tools.payments__charge;
  for (const call of ['first', 'again']) {
    key = option('key');
    const output = await charge.execute({ amount: 5, currency: 'eur' }, { toolCallId: 'call-1', messages: [] });
    report({ call, model_read: await modelRead(charge, output) });
  }
  key = undefined;
  try {
    await charge.execute({ amount: 5, currency: 'eur' }, { toolCallId: 'call-2', messages: [] });
    report({ call: 'unkeyed', error_code: null, error: null });
  } catch (error) {
    report({ call: 'unkeyed', error_code: error.code ?? null, error: error.message });
  }
  key = `${option('key')}-unknown`;
  const output = await charge.execute({ amount: 6, currency: 'eur', hang_ms: 3000 }, { toolCallId: 'call-3', messages: [] });
  report({ call: 'unknown', model_read: await modelRead(charge, output) });
  await client.close();
}

async function sigterm() {
  const { StdioMCPTransport } = await load('@ai-sdk/mcp/mcp-stdio');
  const [command, ...args] = JSON.parse(option('stdio-command'));
  const amount = Number(option('amount'));
  const charges = option('charges');
  const transport = new StdioMCPTransport({ command, args, stderr: 'ignore' });
  const client = await createMCPClient({ transport });
  const tools = await client.tools();
  // Not awaited: the client is closed while the call is in flight.
  tools.payments__charge
    .execute({ amount, currency: 'eur', hang_ms: 1500 }, { toolCallId: 'call-1', messages: [] })
    .catch(() => undefined);
  const charged = () =>
    existsSync(charges) &&
    readFileSync(charges, 'utf8')
      .split('\n')
      .some((line) => line && JSON.parse(line).amount === amount);
  while (!charged()) {
    await new Promise((resolve) => setTimeout(resolve, 20));
  }
  report({ pid: transport.process.pid });
  await client.close();
  report({ closed: true });
}

await { replay, sigterm }[scenario]();
process.exit(0);
