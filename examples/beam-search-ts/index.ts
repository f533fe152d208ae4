// Beam search with forks (the TypeScript twin of beam-search).
//
// Every beam is a context holding its tokens' KV, plus one *pending* token not yet run. Each step
// runs every beam's pending token with a Distribution probe, so one pass both extends the KV and
// yields the top-k continuations; the `beam_width` best extensions (by summed log-probability)
// survive, each in a copy-on-write fork of its parent.
import { Context, Distribution, Model, chat, runtime } from 'inferlet';

interface Beam { ctx?: Context; pending: number[]; tokens: number[]; score: number }

async function topK(ctx: Context, pending: number[], k: number): Promise<[number, number][]> {
  const fwd = ctx.forward().input(pending);
  const h = fwd.probe(pending.length - 1, Distribution(1.0, k));
  const [ids, probs] = (await fwd.execute()).distribution(h)!;
  const out: [number, number][] = [];
  ids.forEach((t, i) => { if (probs[i] > 0) out.push([t, Math.log(probs[i])]); });
  return out;
}

export async function main(input: { prompt: string; beam_width: number; max_tokens: number }) {
  const model = Model.load(runtime.models()[0]);
  const width = input.beam_width;
  const stop = new Set(chat.stopTokens(model));

  // The root beam's pending tokens are the whole prompt: its KV is computed once, then shared.
  const prompt = [...chat.user(model, input.prompt), ...chat.cue(model)];
  let beams: Beam[] = [{ ctx: new Context(model), pending: prompt, tokens: [], score: 0.0 }];
  const finished: Beam[] = [];

  for (let step = 0; step < input.max_tokens; step++) {
    const options = await Promise.all(beams.map((b) => topK(b.ctx!, b.pending, width)));
    const candidates: [number, Beam, number][] = [];
    beams.forEach((b, i) => { for (const [t, lp] of options[i]) candidates.push([b.score + lp, b, t]); });
    candidates.sort((a, b) => b[0] - a[0]);
    const survivors: Beam[] = [];
    for (const [score, parent, t] of candidates.slice(0, Math.max(0, width - finished.length))) {
      const beam = { tokens: [...parent.tokens, t], score, pending: [] as number[] };
      if (stop.has(t)) finished.push(beam); // a complete answer: no context needed any more
      else survivors.push({ ...beam, ctx: parent.ctx!.fork(), pending: [t] });
    }
    for (const b of beams) b.ctx!.release();
    beams = survivors;
    if (beams.length === 0) break;
  }

  for (const b of beams) b.ctx!.release();
  const tok = model.tokenizer();
  const ranked = [...finished, ...beams].sort((a, b) => b.score - a.score);
  const results = ranked.map((b) => ({ text: tok.decode(b.tokens.filter((t) => !stop.has(t))), score: b.score }));
  return { text: results[0].text, score: results[0].score, beams: results };
}
