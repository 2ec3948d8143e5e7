// The official OpenAI client for Node.js against `anchorkv serve`:
//   node openai_client.cjs BASE_URL
// Each check prints one line; the process exits 1 at the first that fails.
const OpenAI = require("openai");
const assert = require("node:assert/strict");

const client = new OpenAI({ baseURL: process.argv[2], apiKey: "unused", maxRetries: 0, timeout: 30000 });
const PROMPT = "In the beginning God created the heaven and the earth.";

async function check(name, fn) {
  try {
    await fn();
    console.log(`ok ${name}`);
  } catch (e) {
    console.log(`FAILED ${name}: ${e && e.stack ? e.stack : e}`);
    process.exit(1);
  }
}

async function main() {
  await check("models", async () => {
    const models = await client.models.list();
    assert.equal(models.data.length, 1);
  });
  await check("max_completion_tokens is honoured, the smaller of the two wins", async () => {
    const a = await client.chat.completions.create({
      model: "m", messages: [{ role: "user", content: PROMPT }], max_completion_tokens: 60, temperature: 0,
      stop: [], user: "u1", metadata: { k: "v" }, store: false, n: 1, presence_penalty: 0, frequency_penalty: 0,
      logit_bias: {},
    });
    assert.ok(a.usage.completion_tokens > 16 || a.choices[0].finish_reason === "stop", JSON.stringify(a.usage));
    assert.ok(a.usage.completion_tokens <= 60);
    const b = await client.completions.create({ model: "m", prompt: PROMPT, max_tokens: 5, temperature: 0 });
    assert.equal(b.usage.completion_tokens, 5);
    const c = await client.chat.completions.create({
      model: "m", messages: [{ role: "user", content: PROMPT }], max_tokens: 40, max_completion_tokens: 7,
      temperature: 0,
    });
    assert.ok(c.usage.completion_tokens <= 7);
  });
  await check("a stream with include_usage ends with a usage chunk", async () => {
    const stream = await client.chat.completions.create({
      model: "m", messages: [{ role: "user", content: PROMPT }], max_tokens: 12, temperature: 0, stream: true,
      stream_options: { include_usage: true },
    });
    let text = "", usage = null, finish = null, role = null;
    for await (const chunk of stream) {
      if (chunk.usage) usage = chunk.usage;
      for (const c of chunk.choices) {
        text += c.delta.content || "";
        role = role || c.delta.role;
        finish = c.finish_reason || finish;
      }
    }
    assert.equal(role, "assistant");
    assert.ok(usage && usage.completion_tokens > 0 && usage.total_tokens === usage.prompt_tokens + usage.completion_tokens);
    const plain = await client.chat.completions.create({
      model: "m", messages: [{ role: "user", content: PROMPT }], max_tokens: 12, temperature: 0,
    });
    assert.equal(text, plain.choices[0].message.content);
    assert.equal(finish, plain.choices[0].finish_reason);
  });
  await check("n choices, each sampled with its own seed", async () => {
    const r = await client.completions.create({ model: "m", prompt: PROMPT, max_tokens: 8, n: 3, seed: 5, temperature: 1 });
    assert.deepEqual(r.choices.map((c) => c.index), [0, 1, 2]);
    const again = await client.completions.create({ model: "m", prompt: PROMPT, max_tokens: 8, n: 3, seed: 5, temperature: 1 });
    assert.deepEqual(again.choices.map((c) => c.text), r.choices.map((c) => c.text));
    const one = await client.completions.create({ model: "m", prompt: PROMPT, max_tokens: 8, seed: 6, temperature: 1 });
    assert.equal(one.choices[0].text, r.choices[1].text);
  });
  await check("logit_bias and penalties change the answer", async () => {
    const base = await client.completions.create({ model: "m", prompt: PROMPT, max_tokens: 1, temperature: 0, logprobs: 1 });
    const first = Buffer.from(base.choices[0].text, "utf8")[0];
    const biased = await client.completions.create({
      model: "m", prompt: PROMPT, max_tokens: 1, temperature: 0, logit_bias: { [String(3 + first)]: -100 },
    });
    assert.notEqual(biased.choices[0].text, base.choices[0].text);
    const plain = await client.completions.create({ model: "m", prompt: "aaaa", max_tokens: 24, temperature: 0 });
    const penalized = await client.completions.create({
      model: "m", prompt: "aaaa", max_tokens: 24, temperature: 0, frequency_penalty: 2, presence_penalty: 2,
    });
    assert.notEqual(penalized.choices[0].text, plain.choices[0].text);
  });
  for (const [field, value] of [["echo", true], ["n", 17], ["best_of", 3], ["suffix", "x"], ["presence_penalty", 3],
                                ["logit_bias", { "999999": 1 }], ["response_format", { type: "json_object" }]]) {
    await check(`${field}: ${JSON.stringify(value)} is refused naming the field`, async () => {
      try {
        await client.completions.create({ model: "m", prompt: PROMPT, max_tokens: 2, [field]: value });
        assert.fail("accepted");
      } catch (e) {
        assert.ok(e instanceof OpenAI.BadRequestError, String(e));
        assert.equal(e.status, 400);
        assert.equal(e.param, field);
      }
    });
  }
}

main();
