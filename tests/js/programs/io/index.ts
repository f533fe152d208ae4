// Session, runtime, messaging and the market from a JS guest: what each returns comes back.
import { Context, Model, messaging, runtime, scheduling, session } from 'inferlet';

export async function main(input: { topic: string }) {
  using sub = messaging.subscribe(input.topic);
  messaging.broadcast(input.topic, 'first');
  messaging.broadcast(input.topic, 'second');
  const got = [await sub.next(), await sub.next()];
  messaging.push('jobs', 'job-1');
  const pulled = await messaging.pull('jobs');
  session.send('hello');
  session.send({ n: 1 });
  const reply = await session.receive();
  const model = Model.load(runtime.models()[0]);
  using ctx = new Context(model);
  ctx.user('Hi.');
  await ctx.flush();
  return {
    got, pulled, reply, topic: sub.topic, models: runtime.models(), user: runtime.username(),
    version: runtime.version(), seqLen: ctx.seqLen, price: scheduling.price() > 0,
    balance: typeof scheduling.balance(model) === 'number',
  };
}
