// Generate options beyond maxTokens: a static logit mask (BRLE, first run disallowed) and an adapter.
import { Adapter, Context, Model, Sampler, runtime } from 'inferlet';

export async function main() {
  const model = Model.load(runtime.models()[0]);
  using ctx = new Context(model);
  ctx.user('Count.');
  const masked = await ctx.generate(Sampler.argmax(), { maxTokens: 6, stop: [], logitMask: [1000, 50, model.vocabSize - 1050] }).collectTokens();
  using fork = new Context(model);
  fork.user('Count.');
  using a = Adapter.create(model, 'js-options');
  const adapted = await fork.generate(Sampler.argmax(), { maxTokens: 6, stop: [], adapter: a }).collectTokens();
  return { masked: Array.from(masked), adapted: Array.from(adapted) };
}
