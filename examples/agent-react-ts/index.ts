// ReAct agent: thought -> action -> observation, with the loop beside the model (the TypeScript
// twin of agent-react; same parameters, same value on the same model and sampler).
//
// What a client loop over an OpenAI endpoint pays on every turn, this inferlet does not:
// - The context stays: the conversation lives in one Context across turns; each turn prefills
//   only the new observation, and the model's own tokens stay exactly as sampled.
// - Idle during tools: `using _ = ctx.idle()` around the tool wait takes the context out of the
//   KV-page market, so under contention its pages go to agents decoding meanwhile.
// - Concurrent tools: the actions of one turn run at once (Promise.all).
//
// mode "text" runs the same loop as one plain transcript (Thought: ... Action: ...
// Observation:) without the chat template. The protocol is in react.ts.
import { Context, Model, Sampler, chat, runtime } from 'inferlet';
import * as react from './react';

interface Input {
  task: string; turns: number; max_tokens: number; tool_delay_s: number; parallel_tools: number;
  mode: string; stop_at_finish: boolean; system?: string;
}

interface Turn { turn: number; text: string; actions: react.Call[]; observation?: string }

export async function main(input: Input) {
  const model = Model.load(runtime.models()[0]);
  const tools = new react.Tools(input.tool_delay_s);
  const log: Turn[] = [];
  let answer: string | null = null;
  let generated = 0;
  using ctx = new Context(model);
  const textMode = input.mode === 'text';
  if (input.mode !== 'chat' && input.mode !== 'text') {
    throw new Error(`mode must be 'chat' or 'text', got '${input.mode}'`);
  }
  const system = input.system || react.SYSTEM;
  const tokenizer = model.tokenizer();
  if (textMode) ctx.append(tokenizer.encode(`${system}\nQuestion: ${input.task}\n`));
  else ctx.system(system).user(input.task);
  for (let turn = 0; turn < input.turns; turn++) {
    let text: string;
    if (textMode) {
      const g = ctx.generate(Sampler.argmax(), { maxTokens: input.max_tokens, autoFlush: false, stop: chat.stopTokens(model) });
      text = tokenizer.decode(await g.collectTokens());
      generated += g.tokensGenerated;
    } else {
      const g = ctx.generate(Sampler.argmax(), { maxTokens: input.max_tokens });
      text = await g.collectText();
      ctx.seal();
      generated += g.tokensGenerated;
    }
    const calls = react.actions(text, input.parallel_tools);
    answer = react.finished(calls);
    log.push({ turn, text, actions: calls });
    if (answer !== null && input.stop_at_finish) break;
    let results: string[];
    {
      using _ = ctx.idle(); // no pass runs while the tools do: lend the pages meanwhile
      results = await tools.run(calls);
    }
    const seen = react.observation(results);
    log[log.length - 1].observation = seen;
    if (textMode) ctx.append(tokenizer.encode(`\n${seen}\n`));
    else ctx.user(seen);
  }
  const kept = ctx.seqLen + ctx.buffer().length;
  return { answer, turns: log.length, tokens: generated, context_tokens: kept, log };
}
