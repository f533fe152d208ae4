// The reasoning and tools decoders, tools on a context's conversation, speculation (a custom
// speculator and the system drafter) and zo return what the Python SDK's return (gaps-py).
import hostTools from 'pie:inferlet/tools@0.1.0';
import { Adapter, Context, Model, Sampler, reasoning, regex, runtime, tools, zo } from 'inferlet';
import type { Speculator } from 'inferlet';

const WEATHER = { name: 'weather', description: 'Weather in a city', parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] } };

/** Drafts the next two tokens of a known continuation, then a wrong one. */
class Oracle implements Speculator {
  seen = 0;
  calls: unknown[] = [];
  constructor(readonly ref: number[], readonly ctx: Context) {}
  draft(): [number[], number[]] {
    const ahead = this.ref.slice(this.seen, this.seen + 2);
    const drafts = ahead.length === 2 ? [...ahead, 7] : ahead;
    const start = this.ctx.seqLen + this.ctx.buffer().length;
    this.calls.push(['draft', drafts]);
    return [drafts, drafts.map((_, i) => start + i)];
  }
  accept(tokens: Uint32Array): void { this.calls.push(['accept', Array.from(tokens)]); this.seen += tokens.length; }
  rollback(n: number): void { this.calls.push(['rollback', n]); }
}

const prompt = (model: Model) => new Context(model).user('Repeat after me: one two three one two three one two three');

export async function main() {
  const model = Model.load(runtime.models()[0]);
  const tk = model.tokenizer();
  const out: Record<string, unknown> = {};

  const ids = Array.from(tk.encode('alpha beta gamma delta épsilon zeta'));
  const dec = new reasoning.Decoder(model, [ids[1], ids[3]]);
  out.reasoning = [...ids, ids[1], ids[0], ids[1], ids[2], ids[3]].map((t) => dec.feed([t]));
  out.reasoningBatch = new reasoning.Decoder(model, [ids[1], ids[3]]).feed(ids);
  out.markers = new reasoning.Decoder(model).markers;

  const text = `Sure.\n${hostTools.formatCall(model.name, 'weather', JSON.stringify({ city: 'Paris' }))}`;
  const tdec = new tools.Decoder(model);
  out.toolEvents = Array.from(tk.encode(text)).map((t) => tdec.feed([t])).filter((e) => e.type !== 'idle');
  out.parsed = tools.parseCall(model, text) ?? null;
  {
    using ctx = new Context(model);
    ctx.equipTools([WEATHER]).user('Weather in Paris?').answerTool('weather', { temp: 21 });
    out.equipped = Array.from(ctx.buffer());
  }

  let reference: number[];
  {
    using ctx = prompt(model);
    reference = Array.from(await ctx.generate(Sampler.argmax(), { maxTokens: 9, stop: [] }).collectTokens());
  }
  out.reference = reference;
  {
    using ctx = prompt(model);
    const spec = new Oracle(reference, ctx);
    const g = ctx.generate(Sampler.argmax(), { maxTokens: 9, stop: [], speculator: spec });
    const steps: number[][] = [];
    for await (const step of g) steps.push(Array.from((await step.execute()).tokens));
    out.speculator = [steps, spec.calls, ctx.seqLen, Array.from(ctx.buffer())];
  }
  {
    using ctx = prompt(model);
    const g = ctx.generate(Sampler.argmax(), { maxTokens: 9, stop: [], systemSpeculation: true, horizon: 4 });
    let steps = 0;
    for await (const step of g) { await step.execute(); steps++; }
    out.system = [Array.from(await g.collectTokens()), steps > 0];
  }
  // drafts are cut where the grammar forbids them, and each row gets the grammar's mask after
  // the drafts before it
  const code = regex('[0-9]{3}-[a-z]{3}');
  let plain: number[];
  {
    using ctx = prompt(model);
    plain = Array.from(await ctx.generate(Sampler.argmax(), { maxTokens: 12, constrain: code }).collectTokens());
  }
  {
    using ctx = prompt(model);
    const spec = new Oracle(plain, ctx);
    const g = ctx.generate(Sampler.argmax(), { maxTokens: 12, constrain: code, speculator: spec });
    out.grammar = [plain, Array.from(await g.collectTokens()), spec.calls];
  }
  {
    using ctx = prompt(model);
    out.grammarSystem = Array.from(await ctx.generate(Sampler.argmax(), { maxTokens: 12, constrain: code, systemSpeculation: true }).collectTokens());
  }
  try {
    using ctx = prompt(model);
    ctx.generate(Sampler.argmax(), { speculator: new Oracle([], ctx), systemSpeculation: true });
  } catch (e) {
    out.both = true;
  }

  using a = Adapter.create(model, 'gaps-zo');
  await zo.initialize(a, 4, 8.0, 2, 0.5, 0.01);
  const scored: number[][] = [];
  for (const seed of [11, 12]) {
    using ctx = prompt(model);
    scored.push(Array.from(await ctx.generate(Sampler.argmax(), { maxTokens: 4, adapter: a, zoSeed: seed }).collectTokens()));
  }
  await zo.update(a, [1.0, 0.0], [11, 12], 0.1);
  out.zo = scored;
  return out;
}
