// The official `openai` npm client against `pagoda serve` on stories260K: model listing,
// completions, chat, and streaming chat, as a user's application would call them.
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import { startServer, testData } from './serve.mjs';

const model = testData('stories260K/stories260K.gguf');
const template = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}" +
  "{% if add_generation_prompt %}assistant:{% endif %}";
const server = await startServer([model, '--served-model-name', 'stories', '--chat-template', template,
  '--api-key', 'sk-node-test', '--disable-log-stats']);
try {
  const client = new OpenAI({ baseURL: server.url + '/v1', apiKey: 'sk-node-test', maxRetries: 0 });

  const models = [];
  for await (const m of client.models.list()) models.push(m);
  assert.equal(models.length, 1);
  assert.equal(models[0].id, 'stories');
  assert.equal(models[0].object, 'model');

  const completion = await client.completions.create({
    model: 'stories', prompt: 'Once upon a time', max_tokens: 20, temperature: 0,
  });
  assert.equal(completion.object, 'text_completion');
  assert.equal(completion.choices.length, 1);
  assert.ok(completion.choices[0].text.length > 0);
  assert.equal(completion.usage.completion_tokens, 20);
  assert.equal(completion.usage.total_tokens, completion.usage.prompt_tokens + 20);

  const chat = await client.chat.completions.create({
    model: 'stories', messages: [{ role: 'user', content: 'Tell me a story.' }], max_tokens: 24, temperature: 0,
    logprobs: true, top_logprobs: 2,
  });
  assert.equal(chat.object, 'chat.completion');
  assert.equal(chat.choices[0].message.role, 'assistant');
  const content = chat.choices[0].message.content;
  assert.ok(content.length > 0);
  assert.ok(chat.choices[0].logprobs.content.length > 0);
  for (const t of chat.choices[0].logprobs.content) {
    assert.ok(t.logprob <= 0);
    assert.ok(t.top_logprobs.length >= 1 && t.top_logprobs.length <= 2);
    assert.ok(Array.isArray(t.bytes));
  }

  const stream = await client.chat.completions.create({
    model: 'stories', messages: [{ role: 'user', content: 'Tell me a story.' }], max_tokens: 24, temperature: 0,
    stream: true, stream_options: { include_usage: true },
  });
  let streamed = '';
  let usage = null;
  let finish = null;
  for await (const chunk of stream) {
    if (chunk.usage) usage = chunk.usage;
    for (const c of chunk.choices) {
      if (c.delta?.content) streamed += c.delta.content;
      if (c.finish_reason) finish = c.finish_reason;
    }
  }
  assert.equal(streamed, content);
  assert.equal(finish, chat.choices[0].finish_reason);
  // The same conversation again: its first full KV block (16 tokens) now comes from the prefix cache.
  assert.equal(usage.prompt_tokens, chat.usage.prompt_tokens);
  assert.equal(usage.completion_tokens, chat.usage.completion_tokens);
  assert.equal(usage.total_tokens, chat.usage.total_tokens);
  assert.equal(chat.usage.prompt_tokens_details.cached_tokens, 0);
  assert.equal(usage.prompt_tokens_details.cached_tokens, 16);

  // The client's own error type for a bad request.
  await assert.rejects(
    client.completions.create({ model: 'stories', prompt: 'Hi', max_tokens: -1 }),
    (e) => e.status === 400 && e.error?.param === 'max_tokens');
  await assert.rejects(
    new OpenAI({ baseURL: server.url + '/v1', apiKey: 'wrong', maxRetries: 0 }).models.list(),
    (e) => e.status === 401);
  console.log('openai client: models, completions, chat, streaming chat, errors: ok');
} finally {
  assert.equal(await server.stop(), 0);
}
