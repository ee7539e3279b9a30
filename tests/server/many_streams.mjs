// 1000 simultaneous streaming requests on one server: every stream must complete with the
// same greedy text and [DONE], none may fail, and afterwards the engine is idle.
import assert from 'node:assert/strict';
import http from 'node:http';
import { startServer, testData } from './serve.mjs';

const STREAMS = Number(process.env.STREAMS || 1000);
const model = testData('stories260K/stories260K.gguf');
const server = await startServer([model, '--served-model-name', 'stories', '--max-num-seqs', '256',
  '--disable-log-requests', '--disable-log-stats']);
const { hostname, port } = new URL(server.url);
const agent = new http.Agent({ keepAlive: false, maxSockets: Infinity });

function stream(body) {
  return new Promise((resolve, reject) => {
    const req = http.request({ hostname, port, path: '/v1/completions', method: 'POST', agent,
      headers: { 'Content-Type': 'application/json' } }, (res) => {
      let raw = '';
      res.setEncoding('utf8');
      res.on('data', (d) => { raw += d; });
      res.on('end', () => resolve({ status: res.statusCode, raw }));
      res.on('error', reject);
    });
    req.on('error', reject);
    req.end(JSON.stringify(body));
  });
}

function text(raw) {
  const events = raw.split('\n\n').filter((e) => e.startsWith('data: ')).map((e) => e.slice(6));
  assert.equal(events.at(-1), '[DONE]');
  return events.slice(0, -1).map((e) => JSON.parse(e).choices[0].text).join('');
}

try {
  const body = { prompt: 'Once upon a time', max_tokens: 48, temperature: 0, ignore_eos: true, stream: true };
  const started = Date.now();
  const pending = Promise.all(Array.from({ length: STREAMS }, () => stream(body)));
  // Watch the server while the streams run: how many requests it holds at once, and its memory.
  let peak = 0;
  let peakRss = 0;
  let done = false;
  pending.finally(() => { done = true; });
  while (!done) {
    const m = await (await fetch(server.url + '/metrics')).text();
    const value = (name) => Number((m.match(new RegExp(`^${name}(?:\\{[^}]*\\})? (\\S+)$`, 'm')) || [])[1] || 0);
    peak = Math.max(peak, value('vllm:num_requests_running') + value('vllm:num_requests_waiting'));
    peakRss = Math.max(peakRss, value('process_resident_memory_bytes'));
    await new Promise((r) => setTimeout(r, 10));
  }
  const results = await pending;
  const seconds = (Date.now() - started) / 1000;
  // They were in the server together, not one after another.
  assert.ok(peak >= STREAMS / 2, `at most ${peak} requests were in the server at once`);
  const want = text(results[0].raw);
  assert.ok(want.length > 0);
  let ok = 0;
  for (const r of results) {
    assert.equal(r.status, 200);
    assert.equal(text(r.raw), want);
    ok++;
  }
  assert.equal(ok, STREAMS);
  const metrics = await (await fetch(server.url + '/metrics')).text();
  assert.match(metrics, /^vllm:num_requests_running\{model_name="stories",engine="0"\} 0$/m);
  assert.match(metrics, /^vllm:kv_cache_usage_perc\{model_name="stories",engine="0"\} 0$/m);
  assert.match(metrics, new RegExp(`^vllm:request_success_total\\{model_name="stories",engine="0",finished_reason="length"\\} ${STREAMS}$`, 'm'));
  console.log(`${STREAMS} concurrent streams: all complete and equal, ${seconds.toFixed(1)} s, ` +
    `up to ${peak} requests in the server at once, server RSS up to ${(peakRss / 2 ** 20).toFixed(0)} MiB`);
} finally {
  assert.equal(await server.stop(), 0);
}
