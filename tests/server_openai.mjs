// The official `openai` npm client against `kvpred serve` (run by tests/test_server.py, which
// starts the server and passes what `kvpred run` answered): a non-streamed and a streamed
// completion and chat completion, the extension field passed through, and an error mapped to
// the client's APIError. Prints one JSON line with what it got; exits non-zero on a mismatch.
import OpenAI from 'openai';

const [port, key, prompt, want, chatPrompt] = process.argv.slice(2);
const client = new OpenAI({ baseURL: `http://127.0.0.1:${port}/v1`, apiKey: key, maxRetries: 0 });
const fail = (msg) => { console.error('FAIL:', msg); process.exit(1); };

const c = await client.completions.create({ model: 'kvpred-default', prompt, max_tokens: 40 });
if (c.choices[0].text !== want) fail(`completion: ${JSON.stringify(c.choices[0].text)}`);
if (!(c.usage.prompt_tokens > 0)) fail('usage');

let streamed = '';
const s = await client.completions.create({ model: 'kvpred-default', prompt, max_tokens: 40,
                                            stream: true });
for await (const chunk of s) streamed += chunk.choices[0]?.text ?? '';
if (streamed !== want) fail(`streamed completion: ${JSON.stringify(streamed)}`);

const ch = await client.chat.completions.create({
    model: 'kvpred-default', max_tokens: 30,
    messages: [{ role: 'user', content: chatPrompt }] });
const chatText = ch.choices[0].message.content;
let chatStreamed = '', usage = null;
const cs = await client.chat.completions.create({
    model: 'kvpred-default', max_tokens: 30, stream: true, stream_options: { include_usage: true },
    messages: [{ role: 'user', content: chatPrompt }], kvpred: { policy: 'quest', budget: '1/2' } });
for await (const chunk of cs) {
    chatStreamed += chunk.choices[0]?.delta?.content ?? '';
    if (chunk.usage) usage = chunk.usage;
}
if (!usage || usage.completion_tokens < 1) fail('stream usage');

let status = 0;
try {
    await client.completions.create({ model: 'no-such-model', prompt: 'x' });
} catch (e) {
    status = e.status;
}
if (status !== 404) fail(`unknown model gave ${status}`);
console.log(JSON.stringify({ chat: chatText, chat_quest_streamed: chatStreamed }));
