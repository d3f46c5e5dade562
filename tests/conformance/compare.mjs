// Collects the per-scenario output of the MCP conformance suite (server mode),
// writes results.json, and compares it with the committed expected.json.
//
// Usage (run.sh calls this; you normally don't):
//   node compare.mjs --out OUT_DIR --expected expected.json --suite NAME@VERSION --url URL [--update] [--subset]
//
// --subset: only some scenarios were run (CONFORMANCE_SCENARIOS); compare only
// those, and with --update merge them into expected.json instead of replacing it.
//
// OUT_DIR layout (written by run.sh):
//   scenarios.txt            one scenario name per line, as listed by the suite
//   raw/<scenario>/...       the suite's own -o output (…/checks.json)
//   logs/<scenario>.log      stdout+stderr of that scenario's run
//   exit/<scenario>          exit code of that run (124/137 = timed out)
//
// Exit code: 0 = every scenario matched expected.json, 1 = at least one
// mismatch (or expected.json missing/invalid), 2 = bad invocation.

import fs from 'node:fs';
import path from 'node:path';

function parseArgs(argv) {
  const a = { update: false, subset: false };
  for (let i = 0; i < argv.length; i++) {
    const k = argv[i];
    if (k === '--update') a.update = true;
    else if (k === '--subset') a.subset = true;
    else if (['--out', '--expected', '--suite', '--url'].includes(k)) a[k.slice(2)] = argv[++i];
    else {
      console.error(`compare.mjs: unknown argument ${k}`);
      process.exit(2);
    }
  }
  for (const k of ['out', 'expected', 'suite', 'url']) {
    if (!a[k]) {
      console.error(`compare.mjs: --${k} is required`);
      process.exit(2);
    }
  }
  return a;
}

const args = parseArgs(process.argv.slice(2));
const out = args.out;

const oneLine = (s) => String(s ?? '').replace(/\s+/g, ' ').trim();
const clip = (s, n = 300) => (s.length > n ? s.slice(0, n - 1) + '…' : s);

function findChecks(dir) {
  // The suite writes <dir>/server-<scenario>-<timestamp>/checks.json.
  if (!fs.existsSync(dir)) return null;
  const stack = [dir];
  while (stack.length) {
    const d = stack.pop();
    for (const e of fs.readdirSync(d, { withFileTypes: true })) {
      const p = path.join(d, e.name);
      if (e.isDirectory()) stack.push(p);
      else if (e.name === 'checks.json') return p;
    }
  }
  return null;
}

function lastLines(file, n) {
  if (!fs.existsSync(file)) return '';
  const lines = fs.readFileSync(file, 'utf8').split('\n').filter((l) => l.trim());
  return lines.slice(-n).join(' | ');
}

// ---- collect actual results ------------------------------------------------
const scenarios = fs
  .readFileSync(path.join(out, 'scenarios.txt'), 'utf8')
  .split('\n')
  .map((s) => s.trim())
  .filter(Boolean);

const actual = {};
for (const name of scenarios) {
  const exitFile = path.join(out, 'exit', name);
  const exitCode = fs.existsSync(exitFile) ? Number(fs.readFileSync(exitFile, 'utf8').trim()) : null;
  const timedOut = exitCode === 124 || exitCode === 137;
  const checksFile = findChecks(path.join(out, 'raw', name));
  const counts = { SUCCESS: 0, FAILURE: 0, WARNING: 0, SKIPPED: 0, INFO: 0 };
  const failures = [];
  const warnings = [];
  let checks = null;
  if (checksFile) {
    try {
      checks = JSON.parse(fs.readFileSync(checksFile, 'utf8'));
    } catch (e) {
      checks = null;
    }
  }
  if (Array.isArray(checks)) {
    for (const c of checks) {
      counts[c.status] = (counts[c.status] ?? 0) + 1;
      const msg = clip(oneLine(c.errorMessage ?? c.details?.message ?? c.description));
      if (c.status === 'FAILURE') failures.push({ id: c.id, message: msg });
      if (c.status === 'WARNING') warnings.push({ id: c.id, message: msg });
    }
  }
  let result;
  if (timedOut) {
    result = 'fail';
    failures.push({ id: '(harness)', message: `timed out (exit ${exitCode}); see logs/${name}.log` });
  } else if (!Array.isArray(checks)) {
    result = 'fail';
    failures.push({
      id: '(harness)',
      message: clip(`no checks.json written (exit ${exitCode}); log tail: ${lastLines(path.join(out, 'logs', `${name}.log`), 3)}`)
    });
  } else {
    result = counts.FAILURE > 0 ? 'fail' : 'pass';
  }
  actual[name] = { result, exit_code: exitCode, counts, failures, warnings };
}

fs.writeFileSync(
  path.join(out, 'results.json'),
  JSON.stringify(
    { suite: args.suite, url: args.url, generated_at: new Date().toISOString(), scenarios: actual },
    null,
    2
  ) + '\n'
);

// ---- load expected -----------------------------------------------------------
function loadExpected(file) {
  if (!fs.existsSync(file)) return { error: `expected file ${file} does not exist` };
  let j;
  try {
    j = JSON.parse(fs.readFileSync(file, 'utf8'));
  } catch (e) {
    return { error: `expected file ${file} is not valid JSON: ${e.message}` };
  }
  const problems = [];
  const exp = {};
  for (const [name, v] of Object.entries(j.scenarios ?? {})) {
    if (v === 'pass' || v?.result === 'pass') exp[name] = { result: 'pass' };
    else if (v?.result === 'fail' && typeof v.reason === 'string' && v.reason.trim())
      exp[name] = { result: 'fail', reason: v.reason };
    else problems.push(`${name}: must be "pass" or {"result": "fail", "reason": "<non-empty>"}`);
  }
  return { suite: j.suite, scenarios: exp, problems, raw: j };
}

const expected = loadExpected(args.expected);

// ---- --update: rewrite expected.json from this run ------------------------------
if (args.update) {
  const prev = expected.error ? {} : expected.scenarios;
  const scenariosOut = {};
  if (args.subset && !expected.error) Object.assign(scenariosOut, expected.raw.scenarios ?? {});
  for (const name of scenarios) {
    const a = actual[name];
    if (a.result === 'pass') scenariosOut[name] = 'pass';
    else {
      const keep = prev[name]?.result === 'fail' ? prev[name].reason : null;
      const auto = a.failures.map((f) => `${f.id}: ${f.message}`).join('; ');
      scenariosOut[name] = { result: 'fail', reason: keep ?? `TODO explain — observed: ${clip(auto, 400)}` };
    }
  }
  const doc = {
    _comment:
      (!expected.error && expected.raw._comment) ||
      'Expected outcome of each MCP conformance server scenario against the server under test (leasegate in CI). Regenerate with `tests/conformance/run.sh URL --update`, then review every reason. See tests/conformance/README.md.',
    suite: args.suite,
    scenarios: scenariosOut
  };
  fs.writeFileSync(args.expected, JSON.stringify(doc, null, 2) + '\n');
  console.log(`Updated ${args.expected} from this run (${scenarios.length} scenarios).`);
}

// ---- compare -------------------------------------------------------------------
const mismatches = [];
const rows = [];
if (expected.error) {
  mismatches.push(expected.error);
} else {
  for (const p of expected.problems) mismatches.push(`expected.json: ${p}`);
  if (expected.suite && expected.suite !== args.suite)
    mismatches.push(`expected.json was written for ${expected.suite}, but the suite run is ${args.suite}`);
  const names = args.subset ? scenarios : [...new Set([...scenarios, ...Object.keys(expected.scenarios)])];
  for (const name of names) {
    const a = actual[name];
    const e = expected.scenarios[name];
    let verdict;
    if (!a) verdict = 'MISSING (in expected.json, but the suite no longer lists it)';
    else if (!e) verdict = `NEW (not in expected.json; got ${a.result})`;
    else if (a.result !== e.result) verdict = `UNEXPECTED ${a.result.toUpperCase()} (expected ${e.result})`;
    else verdict = 'ok';
    rows.push({ name, actual: a?.result ?? '-', expected: e?.result ?? '-', verdict, a, e });
    if (verdict !== 'ok') mismatches.push(`${name}: ${verdict}`);
  }
}

const w = Math.max(8, ...rows.map((r) => r.name.length));
console.log('');
console.log(`Conformance results (${args.suite} against ${args.url})`);
console.log(`${'scenario'.padEnd(w)}  actual  expected  verdict`);
for (const r of rows) {
  // A scenario can "pass" with no SUCCESS check at all (e.g. it bails out with
  // a WARNING when the server gives no session id); flag that so nobody
  // mistakes it for real coverage.
  const vacuous =
    r.a?.result === 'pass' && r.a.counts.SUCCESS === 0
      ? `  (vacuous: 0 checks succeeded, ${r.a.counts.WARNING} warnings)`
      : '';
  console.log(`${r.name.padEnd(w)}  ${r.actual.padEnd(6)}  ${r.expected.padEnd(8)}  ${r.verdict}${vacuous}`);
  if (r.verdict !== 'ok' && r.a?.result === 'fail')
    for (const f of r.a.failures) console.log(`${' '.repeat(w)}    - ${f.id}: ${f.message}`);
}
const todo = expected.error ? [] : Object.entries(expected.scenarios).filter(([, e]) => /^TODO/.test(e.reason ?? ''));
if (todo.length && !args.update)
  console.log(`Note: ${todo.length} expected failure(s) still have a TODO reason: ${todo.map(([n]) => n).join(', ')}`);
const nPass = Object.values(actual).filter((a) => a.result === 'pass').length;
console.log('');
console.log(`Suite: ${nPass} of ${scenarios.length} scenarios passed; results in ${path.join(out, 'results.json')}`);
if (mismatches.length) {
  console.log(args.update ? 'Changes relative to the previous expected file:' : 'Differences from expected.json:');
  for (const m of mismatches) console.log(`  - ${m}`);
  if (!args.update)
    console.log('If a change is intended, update tests/conformance/expected.json (see tests/conformance/README.md).');
}
// Closing line: scenarios that matched expected.json vs. those that did not.
const matched = rows.filter((r) => r.verdict === 'ok').length;
if (!args.update) console.log(`conformance: ${matched} passed, ${mismatches.length} failed`);
process.exit(args.update ? 0 : mismatches.length ? 1 : 0);
