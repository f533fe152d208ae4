// The SDK's event loop: its Promise settles in the order of the language's, and runMain waits in
// poll.wait for host calls, settling each as the host says it finished.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { PiePromise, hostCall, installLoop, runMain } from '../src/loop';

const poll = (globalThis as any).__fakeHost.poll;

test('reactions run in the order a native Promise runs them', () => {
  installLoop();
  const seen: string[] = [];
  const value = runMain(async () => {
    const a = PiePromise.resolve(1).then((x) => { seen.push(`a${x}`); return x + 1; });
    const b = new PiePromise<number>((r) => r(10)).then((x) => { seen.push(`b${x}`); return x; });
    seen.push('sync');
    const [x, y] = await PiePromise.all([a, b]);
    return x + y;
  });
  assert.equal(value, 12);
  assert.deepEqual(seen, ['sync', 'a1', 'b10']);
});

test('a rejection reaches catch, finally runs, and main throws its error', () => {
  installLoop();
  let cleaned = false;
  assert.throws(() => runMain(async () => {
    await PiePromise.reject(new Error('boom')).finally(() => { cleaned = true; });
  }), /boom/);
  assert.ok(cleaned);
  assert.equal(runMain(() => PiePromise.reject<number>(new Error('x')).catch(() => 7)), 7);
});

test('main waits in poll.wait and host calls settle in the order the host finishes them', () => {
  installLoop();
  const waited: number[][] = [];
  poll.wait = (calls: number[]) => { waited.push(calls.slice()); return [calls.length - 1]; };
  const order: number[] = [];
  const value = runMain(async () => {
    const one = hostCall(1, (c) => { order.push(c); return 'one'; });
    const two = hostCall(2, (c) => { order.push(c); return 'two'; });
    return (await PiePromise.all([one, two])).join('+');
  });
  assert.equal(value, 'one+two');
  assert.deepEqual(order, [2, 1]);
  assert.deepEqual(waited, [[1, 2], [1]]);
});

test('a host call that fails rejects its promise with the error', () => {
  installLoop();
  poll.wait = (calls: number[]) => calls.map((_, i) => i);
  assert.equal(runMain(async () => {
    try { await hostCall(5, () => { throw new Error('refused'); }); } catch (e) { return (e as Error).message; }
    return 'no error';
  }), 'refused');
});

test('main awaiting a promise nothing will settle fails instead of hanging', () => {
  installLoop();
  assert.throws(() => runMain(() => new PiePromise(() => {})), /can never finish/);
});

test('for await over an async generator runs on the SDK loop (the bundle lowers it)', () => {
  installLoop();
  async function* gen() { yield 1; await null; yield 2; }
  assert.equal(runMain(async () => { let s = 0; for await (const x of gen()) s += x; return s; }), 3);
});

test('setTimeout runs in due order after waiting in poll.wait; clearTimeout cancels; a host call still settles', () => {
  installLoop();
  const realNow = Date.now;
  let now = 1_000;
  Date.now = () => now;
  const waited: [number[], number | null][] = [];
  poll.wait = (calls: number[], timeout: number | null) => {
    waited.push([calls.slice(), timeout]);
    now += timeout ?? 0;
    return calls.length && timeout === null ? [0] : [];
  };
  try {
    const seen: string[] = [];
    const value = runMain(async () => {
      const sleep = (ms: number, tag: string) => new Promise<void>((r) => setTimeout(() => { seen.push(tag); r(); }, ms));
      const dropped = setTimeout(() => seen.push('cleared'), 5);
      clearTimeout(dropped);
      const call = hostCall(9, () => 'host');
      await Promise.all([sleep(20, 'b'), sleep(10, 'a')]);
      return `${await call}:${seen.join('')}`;
    });
    assert.equal(value, 'host:ab');
    assert.deepEqual(waited, [[[9], 10], [[9], 10], [[9], null]]);
  } finally {
    Date.now = realNow;
  }
});
