// The guest's event loop. QuickJS runs promise jobs only when its embedder asks, and the WIT
// export `run` is synchronous, so the SDK brings its own Promise and job queue: the bundle is
// built for ES2016 (esbuild lowers async/await, async generators and `for await` onto
// generators and `Promise`), `installLoop` makes this Promise the global one, and `runMain`
// drains the queue, blocking in the host's `poll.wait` whenever every job waits on a host call
// or a timer (`setTimeout`, also the SDK's: a wait in the host, which the engine can end).
import poll from 'pie:inferlet/poll@0.1.0';

type Job = () => void;
const jobs: Job[] = [];
let head = 0;

const PENDING = 0, FULFILLED = 1, REJECTED = 2;

function isThenable(v: unknown): v is PromiseLike<unknown> {
  return v !== null && (typeof v === 'object' || typeof v === 'function') && typeof (v as any).then === 'function';
}

/** A Promises/A+ promise whose reactions run from the SDK's queue (see the module comment). */
export class PiePromise<T> {
  private state = PENDING;
  private value: unknown = undefined;
  private reactions: Job[] = [];

  constructor(executor: (resolve: (v?: T | PromiseLike<T>) => void, reject: (e?: unknown) => void) => void) {
    let called = false;
    const resolve = (v?: unknown) => { if (!called) { called = true; this.adopt(v); } };
    const reject = (e?: unknown) => { if (!called) { called = true; this.settle(REJECTED, e); } };
    try { executor(resolve, reject); } catch (e) { reject(e); }
  }

  private adopt(v: unknown): void {
    if (v === this) { this.settle(REJECTED, new TypeError('a promise cannot resolve to itself')); return; }
    if (isThenable(v)) {
      let called = false;
      jobs.push(() => {
        try {
          v.then((x) => { if (!called) { called = true; this.adopt(x); } },
                 (e) => { if (!called) { called = true; this.settle(REJECTED, e); } });
        } catch (e) { if (!called) { called = true; this.settle(REJECTED, e); } }
      });
      return;
    }
    this.settle(FULFILLED, v);
  }

  private settle(state: number, value: unknown): void {
    if (this.state !== PENDING) return;
    this.state = state;
    this.value = value;
    for (const r of this.reactions) jobs.push(r);
    this.reactions = [];
  }

  then<A = T, B = never>(onOk?: ((v: T) => A | PromiseLike<A>) | null, onErr?: ((e: any) => B | PromiseLike<B>) | null): PiePromise<A | B> {
    return new PiePromise<A | B>((resolve, reject) => {
      const react = () => {
        try {
          if (this.state === FULFILLED) onOk ? resolve(onOk(this.value as T)) : resolve(this.value as A);
          else onErr ? resolve(onErr(this.value)) : reject(this.value);
        } catch (e) { reject(e); }
      };
      if (this.state === PENDING) this.reactions.push(react); else jobs.push(react);
    });
  }

  catch<B = never>(onErr?: ((e: any) => B | PromiseLike<B>) | null): PiePromise<T | B> {
    return this.then(null, onErr);
  }

  finally(f?: (() => void) | null): PiePromise<T> {
    return this.then(
      (v) => PiePromise.resolve(f ? f() : undefined).then(() => v),
      (e) => PiePromise.resolve(f ? f() : undefined).then(() => { throw e; }),
    ) as PiePromise<T>;
  }

  static resolve<V>(v?: V | PromiseLike<V>): PiePromise<V> {
    return v instanceof PiePromise ? v : new PiePromise<V>((r) => r(v));
  }

  static reject<V = never>(e?: unknown): PiePromise<V> {
    return new PiePromise<V>((_, r) => r(e));
  }

  static all<V>(items: Iterable<V | PromiseLike<V>>): PiePromise<V[]> {
    return new PiePromise<V[]>((resolve, reject) => {
      const list = Array.from(items), out: V[] = new Array(list.length);
      let left = list.length;
      if (left === 0) resolve(out);
      list.forEach((p, i) => PiePromise.resolve(p).then((v) => { out[i] = v as V; if (--left === 0) resolve(out); }, reject));
    });
  }

  static allSettled<V>(items: Iterable<V | PromiseLike<V>>): PiePromise<PromiseSettledResult<V>[]> {
    return PiePromise.all(Array.from(items).map((p) => PiePromise.resolve(p).then(
      (value) => ({ status: 'fulfilled' as const, value: value as V }),
      (reason) => ({ status: 'rejected' as const, reason }))));
  }

  static race<V>(items: Iterable<V | PromiseLike<V>>): PiePromise<V> {
    return new PiePromise<V>((resolve, reject) => { for (const p of items) PiePromise.resolve(p).then(resolve, reject); });
  }

  static any<V>(items: Iterable<V | PromiseLike<V>>): PiePromise<V> {
    return new PiePromise<V>((resolve, reject) => {
      const list = Array.from(items), errors: unknown[] = [];
      let left = list.length;
      if (left === 0) reject(new Error('Promise.any: no promise was fulfilled'));
      list.forEach((p, i) => PiePromise.resolve(p).then(resolve, (e) => {
        errors[i] = e;
        if (--left === 0) reject(new Error('Promise.any: no promise was fulfilled'));
      }));
    });
  }

  static withResolvers<V>() {
    let resolve!: (v: V | PromiseLike<V>) => void, reject!: (e?: unknown) => void;
    const promise = new PiePromise<V>((a, b) => { resolve = a as any; reject = b; });
    return { promise, resolve, reject };
  }

  get [Symbol.toStringTag]() { return 'Promise'; }
}

// Timers: id -> when it is due (Date.now() ms) and what it runs.
const timers = new Map<number, { due: number; run: () => void }>();
let nextTimer = 0;
const MAX_WAIT_MS = 2 ** 31 - 1; // poll.wait's timeout is a u32 of milliseconds

/** `setTimeout(f, ms, ...args)`: run `f` once `ms` passed, from the job queue. */
export function setTimeout(f: (...args: any[]) => void, ms = 0, ...args: any[]): number {
  if (typeof f !== 'function') throw new TypeError('setTimeout needs a function');
  const delay = Number(ms) > 0 ? Number(ms) : 0;
  timers.set(++nextTimer, { due: Date.now() + delay, run: () => f(...args) });
  return nextTimer;
}

/** `clearTimeout(id)`: the timer does not run (no-op when it ran or is unknown). */
export function clearTimeout(id: number | undefined): void {
  if (id !== undefined) timers.delete(id);
}

/** Queue the timers that are due, in due order; the milliseconds until the next one (or null). */
function fireDue(): number | null {
  const now = Date.now();
  const due = Array.from(timers).filter(([, t]) => t.due <= now).sort(([a, x], [b, y]) => x.due - y.due || a - b);
  for (const [id, t] of due) { timers.delete(id); jobs.push(t.run); }
  let next: number | null = null;
  for (const t of timers.values()) next = next === null ? t.due - now : Math.min(next, t.due - now);
  return next;
}

/** Make `PiePromise` the global `Promise` (the bundle's lowered async code reads the global),
 * and the SDK's `queueMicrotask`, `setTimeout` and `clearTimeout` the global ones. */
export function installLoop(): void {
  (globalThis as any).Promise = PiePromise;
  (globalThis as any).queueMicrotask = (f: () => void) => { jobs.push(f); };
  (globalThis as any).setTimeout = setTimeout;
  (globalThis as any).clearTimeout = clearTimeout;
}

// Host calls in flight: call number -> how to settle its promise.
const waiting = new Map<number, () => void>();

/** A promise of an async host call's value: `start()` returned its number; `finish(n)` takes its
 * value (the `-result` import) once `poll.wait` says it finished. */
export function hostCall<T>(call: number, finish: (call: number) => T): PiePromise<T> {
  return new PiePromise<T>((resolve, reject) => {
    waiting.set(call, () => {
      try { resolve(finish(call)); } catch (e) { reject(e); }
    });
  });
}

function drain(): void {
  while (head < jobs.length) {
    const job = jobs[head];
    jobs[head++] = undefined as any;
    job();
    if (head > 4096 && head * 2 > jobs.length) { jobs.splice(0, head); head = 0; }
  }
  jobs.length = 0;
  head = 0;
}

/** Run `main` to its end: drain the job queue; while main has not ended, wait in the host for
 * a host call to finish and settle its promise. Returns main's value; throws its error. */
export function runMain<T>(main: () => PromiseLike<T> | T): T {
  let done = false, failed = false, value: any;
  PiePromise.resolve().then(() => main()).then(
    (v) => { done = true; value = v; },
    (e) => { done = true; failed = true; value = e; });
  for (;;) {
    drain();
    if (done) break;
    const next = fireDue();
    if (jobs.length) continue;
    if (waiting.size === 0 && next === null) {
      throw new Error('main is waiting on something that can never finish (no host call or timer is pending): '
        + 'await only SDK calls, timers and promises they settle');
    }
    const calls = Array.from(waiting.keys());
    const ready = poll.wait(calls, next === null ? null : Math.min(MAX_WAIT_MS, Math.max(1, Math.ceil(next))));
    for (const i of ready) {
      const call = calls[i];
      const settle = waiting.get(call);
      waiting.delete(call);
      if (settle) settle();
    }
  }
  timers.clear(); // main ended: a timer it left never runs
  if (failed) throw value;
  return value as T;
}
