// Structured outputs and tool calls through the official `openai` npm client, unchanged, against
// `pagoda serve` on stories260K: chat.completions.parse with zodResponseFormat (the client checks
// the answer against the zod schema itself), and tool calls forced by tool_choice, whole and
// streamed (the client's stream helper assembles the deltas), as an application would make them.
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import { zodFunction, zodResponseFormat } from 'openai/helpers/zod';
import { z } from 'zod';
import { startServer, testData } from './serve.mjs';

const model = testData('stories260K/stories260K.gguf');
// A template that renders tools and calls the way Qwen's does (hermes), small enough to read.
const template =
  "{% if tools %}tools: {% for t in tools %}{{ t['function']['name'] }} {% endfor %}\n{% endif %}" +
  "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}" +
  "{% if add_generation_prompt %}assistant:{% endif %}";
const server = await startServer([model, '--served-model-name', 'stories', '--chat-template', template,
  '--enable-auto-tool-choice', '--tool-call-parser', 'hermes',
  '--structured-outputs-config', '{"disable_any_whitespace": true}', '--disable-log-stats']);
try {
  const client = new OpenAI({ baseURL: server.url + '/v1', apiKey: 'none', maxRetries: 0 });
  const messages = [{ role: 'user', content: 'Tell me about the hero of a story.' }];

  // response_format from a zod schema; parse() validates the answer with zod.
  const Hero = z.object({
    name: z.string().max(12),
    age: z.number().int().min(1).max(99),
    pets: z.array(z.enum(['dog', 'cat'])).max(2),
    brave: z.boolean(),
  });
  for (const seed of [1, 2, 3]) {
    const parsed = await client.chat.completions.parse({
      model: 'stories', messages, max_tokens: 120, temperature: 1, seed,
      response_format: zodResponseFormat(Hero, 'hero'),
    });
    const choice = parsed.choices[0];
    assert.equal(choice.finish_reason, 'stop', choice.message.content);
    assert.ok(choice.message.parsed, choice.message.content);
    Hero.parse(choice.message.parsed);
    assert.deepEqual(Object.keys(JSON.parse(choice.message.content)), ['name', 'age', 'pets', 'brave']);
  }

  // A JSON-schema keyword the server does not support is a 400 naming it, through the client.
  await assert.rejects(
    client.chat.completions.create({
      model: 'stories', messages, max_tokens: 8,
      response_format: { type: 'json_schema', json_schema: { name: 'x', schema: { type: 'integer', multipleOf: 3 } } },
    }),
    (e) => e.status === 400 && /multipleOf/.test(e.message));

  // Tools: a named function and tool_choice required always give calls that parse.
  const weather = zodFunction({
    name: 'get_weather',
    parameters: z.object({ city: z.string().max(16), days: z.number().int().min(1).max(7) }),
  });
  const add = zodFunction({ name: 'add', parameters: z.object({ a: z.number().int(), b: z.number().int() }) });
  const named = await client.chat.completions.parse({
    model: 'stories', messages, max_tokens: 60, temperature: 1, seed: 4, tools: [weather, add],
    tool_choice: { type: 'function', function: { name: 'get_weather' } },
  });
  const call = named.choices[0].message.tool_calls[0];
  assert.equal(named.choices[0].finish_reason, 'stop');  // a named function: 'stop', as OpenAI's
  assert.equal(call.type, 'function');
  assert.equal(call.function.name, 'get_weather');
  assert.ok(call.id.startsWith('call_'));
  weather.$parseRaw(call.function.arguments);  // the client's own check of the arguments
  assert.ok(call.function.parsed_arguments.days >= 1 && call.function.parsed_arguments.days <= 7);

  const required = await client.chat.completions.create({
    model: 'stories', messages, max_tokens: 120, temperature: 1, seed: 5, tools: [weather, add],
    tool_choice: 'required', parallel_tool_calls: false,
  });
  const calls = required.choices[0].message.tool_calls;
  assert.equal(required.choices[0].finish_reason, 'tool_calls');
  assert.equal(calls.length, 1);
  assert.ok(['get_weather', 'add'].includes(calls[0].function.name));
  JSON.parse(calls[0].function.arguments);

  // Streamed: the client's stream helper assembles the deltas into the same message.
  const request = {
    model: 'stories', messages, max_tokens: 60, temperature: 1, seed: 4, tools: [weather, add],
    tool_choice: { type: 'function', function: { name: 'get_weather' } },
  };
  const raw = await fetch(server.url + '/v1/chat/completions', { method: 'POST', headers: { 'content-type': 'application/json', authorization: 'Bearer none' },
    body: JSON.stringify({ ...request, tools: [weather, add].map((t) => ({ type: 'function', function: { name: t.function.name, parameters: t.function.parameters, strict: true } })), stream: true }) });
  const text = await raw.text();
  const firstCall = text.split('\n').find((l) => l.includes('tool_calls'));
  if (!firstCall || !firstCall.includes('"type":"function"')) { console.log('BAD FIRST', text.slice(0, 3000)); process.exit(3); }
  const stream = client.chat.completions.stream(request);
  let deltas = 0;
  stream.on('tool_calls.function.arguments.delta', () => { deltas += 1; });
  const final = await stream.finalChatCompletion();
  const streamed = final.choices[0].message.tool_calls[0];
  assert.ok(deltas > 1, 'the arguments arrive in pieces');
  assert.equal(streamed.function.name, 'get_weather');
  assert.equal(streamed.function.arguments, call.function.arguments);  // same seed, same call
  assert.equal(final.choices[0].finish_reason, 'stop');

  // tool_choice auto with the hermes parser: this model writes no calls, so it answers in text.
  const auto = await client.chat.completions.create({
    model: 'stories', messages, max_tokens: 16, temperature: 0, tools: [weather],
  });
  assert.equal(typeof auto.choices[0].message.content, 'string');
  assert.equal(auto.choices[0].message.tool_calls, undefined);
  console.log('structured outputs and tool calls through the openai client: ok');
} finally {
  await server.stop();
}
