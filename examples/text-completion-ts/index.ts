// Chat completion that streams the reply as it decodes (the TypeScript twin of text-completion).
import { Context, Model, Sampler, chat, runtime, session } from 'inferlet';

interface Input {
  prompt?: string;
  system?: string;
  max_tokens: number;
  temperature: number;
  top_p: number;
  seed: number;
}

export async function main(input: Input): Promise<{ tokens: number }> {
  const model = Model.load(runtime.models()[0]);
  const sampler = input.temperature <= 0 ? Sampler.argmax() : Sampler.topP(input.temperature, input.top_p, input.seed);
  using ctx = new Context(model);
  if (input.system) ctx.system(input.system);
  ctx.user(input.prompt || 'Write a haiku about paged attention.');
  const g = ctx.generate(sampler, { maxTokens: input.max_tokens });
  const dec = new chat.Decoder(model);
  for await (const step of g) {
    const out = await step.execute();
    const ev = dec.feed(out.tokens);
    if (ev.type === 'delta') session.send(ev.text);
  }
  return { tokens: g.tokensGenerated };
}
