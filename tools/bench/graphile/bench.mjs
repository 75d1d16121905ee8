// graphile-worker's side of tools/bench/peers.py (run by tools/bench/graphile.py
// with the pinned Node.js from package.json, beside the installed node_modules).
//
//   node bench.mjs setup
//   node bench.mjs enqueue-single N
//   node bench.mjs enqueue-batch N SIZE
//   node bench.mjs drain CONCURRENCY default|batched
//   node bench.mjs latency CONCURRENCY default|batched
//
// The database comes from PGFLEET_DATABASE_URL (never the command line). Every
// mode but setup talks over stdin/stdout: it connects, prints "ready", waits for
// "go", does the work, prints one JSON line ({"done": jobs, "cpu_s": seconds of
// this process's CPU between "go" and the report}) and exits when stdin closes,
// so the parent times the work alone and meters its CPU apart from start-up.
// latency prints "<job id> <epoch seconds>" per job and stops on a stdin line.
// Logs go to stderr (warnings and errors only).

import { EventEmitter } from "node:events";
import readline from "node:readline";
import { performance } from "node:perf_hooks";
import pg from "pg";
import { Logger, makeWorkerUtils, run, runMigrations, runOnce } from "graphile-worker";

const DSN = process.env.PGFLEET_DATABASE_URL;

// PGFLEET_GRAPHILE_COUNT_QUERIES=1 (tools/bench/profile_drain.py): count the
// statements this process sends, by prepared-statement name or text, into the report.
const counts = process.env.PGFLEET_GRAPHILE_COUNT_QUERIES === "1" ? {} : null;
if (counts) {
  const query = pg.Client.prototype.query;
  pg.Client.prototype.query = function countedQuery(config, ...rest) {
    const text = typeof config === "string" ? config : (config?.name ?? config?.text ?? "?");
    const key = String(text).replace(/\s+/g, " ").trim().slice(0, 60);
    counts[key] = (counts[key] ?? 0) + 1;
    return query.call(this, config, ...rest);
  };
}
if (!DSN) {
  console.error("PGFLEET_DATABASE_URL is not set");
  process.exit(2);
}

const logger = new Logger(() => (level, message) => {
  if (level === "error" || level === "warning") {
    process.stderr.write(`graphile-worker ${level}: ${message}\n`);
  }
});

// What the modes trade (peers.py's report and docs/benchmarks say it in prose):
// default = graphile-worker's defaults (one get_job per job, one delete per job);
// batched = its performance page's settings: a local queue of 500 jobs locked by
// the pool, completions and failures batched with no added delay.
const MODES = {
  default: {},
  batched: { localQueue: { size: 500 }, completeJobBatchDelay: 0, failJobBatchDelay: 0 },
};

const lines = readline.createInterface({ input: process.stdin });
const iterator = lines[Symbol.asyncIterator]();
async function nextLine() {
  const { value, done } = await iterator.next();
  return done ? null : value;
}

function cpuSeconds() {
  const { user, system } = process.cpuUsage();
  return (user + system) / 1e6;
}

function makePool(max) {
  const pool = new pg.Pool({ connectionString: DSN, max });
  pool.on("error", (e) => logger.error(`pool client error: ${e}`));
  pool.on("connect", (client) => client.on("error", (e) => logger.error(`client error: ${e}`)));
  return pool;
}

function poolSize(concurrency) {
  // graphile-worker's advice: max(10, concurrentJobs + 2); capped by the parent
  // (PGFLEET_GRAPHILE_MAX_POOL) because the benchmark's server is shared.
  const cap = Number(process.env.PGFLEET_GRAPHILE_MAX_POOL || "0");
  const advised = Math.max(10, concurrency + 2);
  return cap > 0 ? Math.min(advised, cap) : advised;
}

function preset(concurrency, mode, maxPoolSize) {
  if (!(mode in MODES)) {
    throw new Error(`unknown mode ${mode}: default or batched`);
  }
  return { worker: { concurrentJobs: concurrency, maxPoolSize, ...MODES[mode] } };
}

async function handshake() {
  process.stdout.write("ready\n");
  const line = await nextLine();
  if (line === null || line.trim() !== "go") {
    throw new Error(`expected "go" on stdin, got ${JSON.stringify(line)}`);
  }
  return cpuSeconds();
}

async function report(done, cpu0) {
  const result = { done, cpu_s: cpuSeconds() - cpu0 };
  if (counts) {
    result.queries = counts;
  }
  process.stdout.write(`${JSON.stringify(result)}\n`);
  while ((await nextLine()) !== null) {
    // the parent closes stdin once it has read its meters
  }
}

async function setup() {
  const pool = makePool(2);
  try {
    await runMigrations({ pgPool: pool, logger });
  } finally {
    await pool.end();
  }
}

async function enqueue(total, size) {
  const pool = makePool(2);
  const utils = await makeWorkerUtils({ pgPool: pool, logger });
  try {
    await utils.migrate();
    const cpu0 = await handshake();
    let done = 0;
    if (size === 1) {
      for (let i = 0; i < total; i++) {
        await utils.addJob("noop", { n: i });
        done++;
      }
    } else {
      for (let start = 0; start < total; start += size) {
        const n = Math.min(size, total - start);
        const specs = Array.from({ length: n }, (_, i) => ({
          identifier: "noop",
          payload: { n: start + i },
        }));
        done += (await utils.addJobs(specs)).length;
      }
    }
    await report(done, cpu0);
  } finally {
    await utils.release();
    await pool.end();
  }
}

async function drain(concurrency, mode) {
  const max = poolSize(concurrency);
  const pool = makePool(max);
  try {
    await runMigrations({ pgPool: pool, logger });
    let done = 0;
    const taskList = {
      noop: async () => {
        done++;
      },
    };
    const cpu0 = await handshake();
    // runOnce: run until no job is left, then release (graphile-worker's --once).
    await runOnce({
      pgPool: pool,
      logger,
      noHandleSignals: true,
      taskList,
      preset: preset(concurrency, mode, max),
    });
    await report(done, cpu0);
  } finally {
    await pool.end();
  }
}

async function latency(concurrency, mode) {
  const max = poolSize(concurrency);
  const pool = makePool(max);
  const out = [];
  let flushing = null;
  const flush = () => {
    flushing = null;
    if (out.length > 0) {
      process.stdout.write(out.join(""));
      out.length = 0;
    }
  };
  const taskList = {
    noop: async (_payload, helpers) => {
      const at = (performance.timeOrigin + performance.now()) / 1000;
      out.push(`${helpers.job.id} ${at.toFixed(6)}\n`);
      flushing ??= setImmediate(flush);
    },
  };
  // Ready for new jobs once the pool's LISTEN connection is up.
  const events = new EventEmitter();
  const listening = new Promise((resolve) => events.once("pool:listen:success", resolve));
  try {
    await runMigrations({ pgPool: pool, logger });
    const runner = await run({
      pgPool: pool,
      logger,
      events,
      noHandleSignals: true,
      taskList,
      preset: preset(concurrency, mode, max),
    });
    await listening;
    process.stdout.write("ready\n");
    await nextLine();
    await runner.stop();
    flush();
  } finally {
    await pool.end();
  }
}

async function main() {
  const [mode, ...args] = process.argv.slice(2);
  switch (mode) {
    case "setup":
      await setup();
      break;
    case "enqueue-single":
      await enqueue(Number(args[0]), 1);
      break;
    case "enqueue-batch":
      await enqueue(Number(args[0]), Number(args[1]));
      break;
    case "drain":
      await drain(Number(args[0]), args[1]);
      break;
    case "latency":
      await latency(Number(args[0]), args[1]);
      break;
    default:
      throw new Error(`unknown command ${mode}`);
  }
}

main().then(
  () => process.exit(0),
  (e) => {
    process.stderr.write(`${e?.stack ?? e}\n`);
    process.exit(1);
  },
);
