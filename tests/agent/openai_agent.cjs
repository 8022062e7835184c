// An agent program as a user would write it: the official `openai` npm client, configured only
// by the environment the agent adapter sets (OPENAI_BASE_URL, OPENAI_API_KEY), solving the
// sample's task with one tool. Used by tests/agent/agent_session_test.cc.
//
// Steps: list the models; ask with the `add` tool (tools come from SLIME_METADATA.tools); run
// the tool calls the model made; ask again streamed (SSE, usage included); check that a bad
// request is a 400 naming the field and an unknown session a 404; print a JSON summary on
// stdout. Any surprise exits 1 with the reason on stderr.
'use strict';
const OpenAI = require('openai');

function check(condition, what) {
  if (!condition) throw new Error('agent check failed: ' + what);
}

async function main() {
  const client = new OpenAI({ maxRetries: 0, timeout: 30000 });
  const prompt = JSON.parse(process.env.SLIME_PROMPT);
  const metadata = JSON.parse(process.env.SLIME_METADATA);
  const tools = metadata.tools;

  const models = await client.models.list();
  check(models.data.length === 1 && models.data[0].id === 'slime-test', 'models: ' +
        JSON.stringify(models.data));

  const messages = typeof prompt === 'string' ? [{ role: 'user', content: prompt }] : prompt;
  const first = await client.chat.completions.create({
    model: 'slime-test', messages, tools, max_tokens: 64,
  });
  const choice = first.choices[0];
  check(choice.finish_reason === 'tool_calls', 'first finish_reason ' + choice.finish_reason);
  check(first.usage.prompt_tokens > 0 && first.usage.completion_tokens > 0, 'first usage');
  messages.push(choice.message);
  for (const call of choice.message.tool_calls) {
    check(call.function.name === 'add', 'tool name ' + call.function.name);
    const args = JSON.parse(call.function.arguments);
    messages.push({ role: 'tool', tool_call_id: call.id, content: String(args.a + args.b) });
  }

  const stream = await client.chat.completions.create({
    model: 'slime-test', messages, tools, stream: true, stream_options: { include_usage: true },
  });
  let answer = '';
  let finish = null;
  let usage = null;
  for await (const chunk of stream) {
    if (chunk.usage) usage = chunk.usage;
    for (const c of chunk.choices) {
      if (c.delta && c.delta.content) answer += c.delta.content;
      if (c.finish_reason) finish = c.finish_reason;
    }
  }

  let badRequest = null;
  try {
    await client.chat.completions.create({ model: 'slime-test', messages: [] });
  } catch (e) {
    badRequest = e;
  }
  check(badRequest instanceof OpenAI.APIError && badRequest.status === 400 &&
        badRequest.param === 'messages', 'bad request answer: ' + String(badRequest));

  const stranger = new OpenAI({
    baseURL: client.baseURL.replace(/sessions\/[^/]+/, 'sessions/no-such-session'),
    maxRetries: 0,
  });
  let notFound = null;
  try {
    await stranger.chat.completions.create({ model: 'x', messages });
  } catch (e) {
    notFound = e;
  }
  check(notFound instanceof OpenAI.NotFoundError && notFound.code === 'session_not_found',
        'unknown session answer: ' + String(notFound));

  process.stdout.write(JSON.stringify({ answer, finish, usage }) + '\n');
}

main().catch((e) => {
  process.stderr.write((e && e.stack) ? e.stack + '\n' : String(e) + '\n');
  process.exit(1);
});
