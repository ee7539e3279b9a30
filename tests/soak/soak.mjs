// Soak test with loss accounting (issue 7, section 5): `pagoda serve` under a mixed workload for
// SOAK_SECONDS (default 60), with a client-side ledger of every request.
//
// Workload: 24 client loops sending completions and chat requests with short and long prompts,
// streamed or not, n of 1 to 3, stop strings, 30% cancelled by the client at a random moment,
// 5% invalid (4xx expected); and every 10 s a burst of 150 requests at once, above what the server
// admits (--max-num-seqs 16 + --max-queued-requests 48), so the excess gets 429.
//
// Checks, exit 1 on any failure:
//  - every request ends in exactly one ledger outcome: complete, 4xx, 429, 503, error event, or
//    cancelled by the client; "lost" (anything else: a dropped connection, a stream without
//    [DONE], a 5xx other than 503, no answer) must be 0;
//  - the ledger matches /metrics: the sequences the server finished (length + stop) are at least
//    those of complete requests, and with the aborted ones at most complete + cancelled (a
//    cancel can race a finish); no engine errors;
//  - the server's RSS is flat after warm-up (sampled every 2 s), and once the clients have gone
//    its open fds and threads are back at their count before the load;
//  - at the end the engine is idle: nothing running or waiting, KV cache usage 0.
// Prints a summary (and SOAK_REPORT=path writes it as JSON).
import assert from 'node:assert/strict';
import { readFileSync, readdirSync, writeFileSync } from 'node:fs';
import http from 'node:http';
import { startServer, testData } from '../server/serve.mjs';

const SECONDS = Number(process.env.SOAK_SECONDS || 60);
const LOOPS = 24;
const BURST = 150;
const model = testData('stories260K/stories260K.gguf');
const template = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}" +
  '{% if add_generation_prompt %}assistant:{% endif %}';
const server = await startServer([model, '--served-model-name', 'stories', '--chat-template', template,
  '--max-num-seqs', '16', '--max-queued-requests', '48', '--kv-cache-memory', '2MiB',
  '--max-model-len', '512', '--disable-log-requests', '--disable-log-stats']);
const { hostname, port } = new URL(server.url);
const pid = server.child.pid;
const agent = new http.Agent({ keepAlive: true, maxSockets: Infinity });

// ---- the ledger ----
const outcomes = ['complete', 'client_4xx', 'rejected_429', 'unavailable_503', 'error_event', 'cancelled', 'lost'];
const ledger = Object.fromEntries(outcomes.map((o) => [o, 0]));
const sequences = { complete: 0, cancelled: 0 };
const lostExamples = [];
let sent = 0;

let seed = 12345;
function rand() {  // deterministic workload: a small LCG
  seed = (seed * 1103515245 + 12345) % 2147483648;
  return seed / 2147483648;
}
const pick = (xs) => xs[Math.floor(rand() * xs.length)];

const sentence = 'Once upon a time, there was a little girl named Lily who loved to play in the park. ';
function makeRequest() {
  const chat = rand() < 0.3;
  const long = rand() < 0.3;
  const text = long ? sentence.repeat(1 + Math.floor(rand() * 12)) : pick(['Once upon a time', 'Tom had a dog', 'The sun']);
  const body = { max_tokens: 8 + Math.floor(rand() * 120), stream: rand() < 0.5, temperature: pick([0, 0.8]), seed: 7 };
  if (rand() < 0.2) body.n = 2 + Math.floor(rand() * 2);
  if (rand() < 0.3) body.stop = pick([['.'], ['!', 'dog'], ['\n']]);
  if (body.stream && rand() < 0.5) body.stream_options = { include_usage: true };
  if (rand() < 0.05) body.max_tokens = pick([-1, 0, 'ten']);  // invalid: a 4xx
  if (chat) body.messages = [{ role: 'user', content: text }];
  else body.prompt = text;
  return { path: chat ? '/v1/chat/completions' : '/v1/completions', body, cancelAfterMs: rand() < 0.3 ? Math.floor(rand() * 150) : -1 };
}

function lost(why, r) {
  ledger.lost++;
  if (lostExamples.length < 5) lostExamples.push(`${why}: ${JSON.stringify(r.body).slice(0, 120)}`);
}

// Sends one request and records its outcome. Never rejects.
function send(r) {
  sent++;
  const n = typeof r.body.n === 'number' ? r.body.n : 1;
  return new Promise((resolve) => {
    let settled = false;
    const settle = (outcome) => {
      if (settled) return;
      settled = true;
      if (outcome === 'lost') return resolve();
      ledger[outcome]++;
      if (outcome === 'complete') sequences.complete += n;
      if (outcome === 'cancelled') sequences.cancelled += n;
      resolve();
    };
    let cancelled = false;
    const req = http.request({ hostname, port, path: r.path, method: 'POST', agent,
      headers: { 'Content-Type': 'application/json' } }, (res) => {
      let raw = '';
      res.setEncoding('utf8');
      res.on('data', (d) => { raw += d; });
      res.on('error', () => (cancelled ? settle('cancelled') : (lost('response error', r), settle('lost'))));
      res.on('aborted', () => (cancelled ? settle('cancelled') : (lost('response aborted', r), settle('lost'))));
      res.on('end', () => {
        if (cancelled) return settle('cancelled');
        const s = res.statusCode;
        if (s === 429) return settle('rejected_429');
        if (s === 503) return settle('unavailable_503');
        if (s >= 400 && s < 500) return settle('client_4xx');
        if (s !== 200) { lost(`status ${s}`, r); return settle('lost'); }
        if (!r.body.stream) {
          try { JSON.parse(raw); } catch { lost('bad JSON body', r); return settle('lost'); }
          return settle('complete');
        }
        const events = raw.split('\n\n').filter((e) => e.startsWith('data: ')).map((e) => e.slice(6));
        if (events.at(-1) !== '[DONE]') { lost('stream without [DONE]', r); return settle('lost'); }
        for (const e of events.slice(0, -1)) {
          let j;
          try { j = JSON.parse(e); } catch { lost('bad SSE JSON', r); return settle('lost'); }
          if (j.error) return settle('error_event');
        }
        return settle('complete');
      });
    });
    req.on('error', () => (cancelled ? settle('cancelled') : (lost('request error', r), settle('lost'))));
    if (r.cancelAfterMs >= 0) {
      setTimeout(() => {
        if (settled) return;
        cancelled = true;
        req.destroy();
        settle('cancelled');
      }, r.cancelAfterMs);
    }
    req.end(JSON.stringify(r.body));
  });
}

// ---- server-side figures ----
async function metrics() {
  const m = await (await fetch(server.url + '/metrics')).text();
  const value = (series) => {
    const line = m.split('\n').find((l) => l.startsWith(series + ' '));
    return line ? Number(line.slice(series.length + 1)) : NaN;
  };
  return { text: m, value };
}
function processFigures() {
  const status = readFileSync(`/proc/${pid}/status`, 'utf8');
  const field = (name) => Number((status.match(new RegExp(`^${name}:\\s+(\\d+)`, 'm')) || [])[1]);
  return { rss_mib: field('VmRSS') / 1024, threads: field('Threads'), fds: readdirSync(`/proc/${pid}/fd`).length };
}

const samples = [];
const idleBefore = processFigures();  // no connections yet: the baseline for fds and threads
const started = Date.now();
const deadline = started + SECONDS * 1000;
let failure = null;
try {
  const loops = Array.from({ length: LOOPS }, async () => {
    while (Date.now() < deadline) await send(makeRequest());
  });
  const bursts = (async () => {
    while (Date.now() + 10000 < deadline) {
      await new Promise((r) => setTimeout(r, 10000));
      await Promise.all(Array.from({ length: BURST }, () => send({ ...makeRequest(), cancelAfterMs: -1 })));
    }
  })();
  const sampler = (async () => {
    while (Date.now() < deadline) {
      samples.push({ t: (Date.now() - started) / 1000, ...processFigures() });
      await new Promise((r) => setTimeout(r, 2000));
    }
  })();
  await Promise.all([...loops, bursts, sampler]);

  // Idle at the end: the server finishes what was admitted; aborted work frees its blocks.
  let idle = false;
  let m;
  for (let i = 0; i < 300 && !idle; i++) {
    m = await metrics();
    const label = '{model_name="stories",engine="0"}';
    idle = m.value('vllm:num_requests_running' + label) === 0 && m.value('vllm:num_requests_waiting' + label) === 0 &&
      m.value('vllm:kv_cache_usage_perc' + label) === 0;
    if (!idle) await new Promise((r) => setTimeout(r, 100));
  }
  samples.push({ t: (Date.now() - started) / 1000, ...processFigures() });
  // Idle again with every connection closed: fds and threads must be back at the baseline.
  agent.destroy();
  let idleAfter = processFigures();
  for (let i = 0; i < 50 && idleAfter.fds > idleBefore.fds; i++) {
    await new Promise((r) => setTimeout(r, 100));
    idleAfter = processFigures();
  }
  const finished = (reason) => m.value(`vllm:request_success_total{model_name="stories",engine="0",finished_reason="${reason}"}`);
  const server_side = { length: finished('length'), stop: finished('stop'), abort: finished('abort'), error: finished('error') };

  // Flat after warm-up: compare the samples after the first third with the first of them.
  const warm = samples.filter((s) => s.t >= SECONDS / 3);
  const base = warm[0] || samples[0];
  const last = samples.at(-1);
  const report = {
    seconds: SECONDS, sent, ledger, sequences, server_side, idle,
    rss_mib: { after_warmup: +base.rss_mib.toFixed(1), end: +last.rss_mib.toFixed(1), max: +Math.max(...warm.map((s) => s.rss_mib)).toFixed(1) },
    fds: { idle_before: idleBefore.fds, max_under_load: Math.max(...samples.map((s) => s.fds)), idle_after: idleAfter.fds },
    threads: { idle_before: idleBefore.threads, max_under_load: Math.max(...samples.map((s) => s.threads)),
      idle_after: idleAfter.threads },
    lost_examples: lostExamples,
  };
  console.log(JSON.stringify(report, null, 1));
  if (process.env.SOAK_REPORT) writeFileSync(process.env.SOAK_REPORT, JSON.stringify({ report, samples }, null, 1));

  const accounted = outcomes.reduce((a, o) => a + ledger[o], 0);
  assert.equal(accounted, sent, 'every request sent has exactly one outcome');
  assert.equal(ledger.lost, 0, `requests lost: ${lostExamples.join('; ')}`);
  assert.ok(ledger.complete > 0 && ledger.rejected_429 > 0 && ledger.cancelled > 0 && ledger.client_4xx > 0,
    'the workload reached completions, 429s, cancellations and 4xx');
  assert.ok(idle, 'the engine is idle at the end');
  // A client may cancel a request the server has just finished (its last bytes in flight): the
  // server then counts it finished, the ledger cancelled. So finished sequences lie between the
  // ledger's complete ones and complete + cancelled, and every server-side end is accounted for.
  const finishedSeqs = server_side.length + server_side.stop;
  assert.ok(finishedSeqs >= sequences.complete, `finished sequences ${finishedSeqs} < complete ${sequences.complete}`);
  assert.ok(finishedSeqs + server_side.abort <= sequences.complete + sequences.cancelled,
    `server-side ends ${finishedSeqs + server_side.abort} > complete + cancelled ${sequences.complete + sequences.cancelled}`);
  assert.equal(server_side.error, 0, 'no engine errors');
  // Flat: RSS within 10% (+16 MiB of allocator slack) of the first sample after warm-up; once
  // the clients are gone, fds and threads where they were before any load.
  assert.ok(last.rss_mib <= base.rss_mib * 1.1 + 16, `RSS grew from ${base.rss_mib} to ${last.rss_mib} MiB`);
  assert.ok(idleAfter.fds <= idleBefore.fds, `fds: ${idleBefore.fds} before, ${idleAfter.fds} after`);
  assert.ok(idleAfter.threads <= idleBefore.threads, `threads: ${idleBefore.threads} before, ${idleAfter.threads} after`);
} catch (e) {
  failure = e;
} finally {
  agent.destroy();  // again, for the paths that failed before the end
  const code = await server.stop();
  if (!failure && code !== 0) failure = new Error(`server exited ${code}\n${server.log().slice(-2000)}`);
}
if (failure) {
  console.error(failure.message);
  process.exit(1);
}
