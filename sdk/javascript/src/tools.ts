// Tool use: `import { tools } from 'inferlet'`.
//
// - `equipPrefix` / `answerPrefix`: the tokens that list tools and carry a tool's result, as the
//   model's chat template writes them (`ctx.equipTools` and `ctx.answerTool` do the same on a
//   context's conversation).
// - `Decoder`: watches generated tokens for the model's tool calls; `parseCall`: the first
//   complete call in a finished reply.
// - `nativeGrammar` / `nativeMatcher`: a grammar (or a matcher walking it) over the model's own
//   call syntax, so calls always parse and their arguments follow the tools' schemas.
//
// Qwen 2.5 and Qwen 3 write `<tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>`;
// Llama 3 a bare `{"name": ..., "parameters": {...}}`. Models with no known syntax get undefined
// from `nativeGrammar`/`nativeMatcher` and no events from `Decoder`.
import hostGrammar from 'pie:inferlet/grammar@0.1.0';
import hostModel from 'pie:inferlet/model@0.1.0';
import hostTools from 'pie:inferlet/tools@0.1.0';
import type { ToolCallSyntax } from 'pie:inferlet/types@0.1.0';
import { Utf8 } from './chat';
import { h } from './errors';
import { Grammar, Matcher } from './grammar';
import type { Model } from './model';

export type ToolEvent = { type: 'idle' } | { type: 'start' } | { type: 'call'; name: string; args: string };

const schemasJson = (schemas: Iterable<object | string>) =>
  JSON.stringify(Array.from(schemas, (s) => (typeof s === 'string' ? JSON.parse(s) : s)));
const valueJson = (v: unknown) => JSON.stringify(v);

/** Tokens that register the tool schemas as the model's chat template does (append them first). */
export function equipPrefix(model: Model, schemas: Iterable<object | string>, system?: string): number[] {
  return h(() => hostTools.equipPrefix(model.name, schemasJson(schemas), system ?? null));
}
/** Tokens of a turn carrying tool `name`'s result (`value`: a string, or an object/array, JSON-encoded). */
export function answerPrefix(model: Model, name: string, value: unknown): number[] {
  return h(() => hostTools.answerPrefix(model.name, name, valueJson(value)));
}
/** The grammar of the model's native tool-call syntax for these tools (`choice`: 'auto',
 * 'required' or one tool's name), or undefined when the model has none: generate freely and
 * parse the reply yourself. A Grammar is a Schema: pass it to `constrain`. */
export function nativeGrammar(model: Model, schemas: Iterable<object | string>, choice = 'auto'): Grammar | undefined {
  const source = h(() => hostTools.callGrammar(model.name, schemasJson(schemas), choice));
  return source === null ? undefined : Grammar.fromSource(source);
}
/** A Matcher over the model's native tool-call format, or undefined when it has none. */
export function nativeMatcher(model: Model, schemas: Iterable<object | string>, choice = 'auto'): Matcher | undefined {
  const g = nativeGrammar(model, schemas, choice);
  return g === undefined ? undefined : new Matcher(g, model);
}
/** The first complete tool call in `text` (a reply in the model's call syntax), or undefined.
 * Throws PieError invalid-input for a closed call block that is not a valid call. */
export function parseCall(model: Model, text: string): { type: 'call'; name: string; args: string } | undefined {
  const calls = h(() => hostTools.parseCalls(model.name, text));
  return calls.length ? { type: 'call', name: calls[0][0], args: calls[0][1] } : undefined;
}

/** Turns generated token ids into tool-call events, safe across split UTF-8 sequences.
 *
 * Qwen-style calls start at `<tool_call>` ('start') and complete at `</tool_call>` ('call'); a
 * Llama-style call starts when the reply's text opens with `{` and completes when that JSON
 * object closes. Text outside calls is ignored (use `chat.Decoder` for it). One event per
 * `feed`; when a batch completes more than one call, the others come from the following feeds
 * (`feed([])` drains them). */
export class Decoder {
  private readonly name: string;
  private readonly syntax: ToolCallSyntax | null;
  private readonly stops: Set<number>;
  private utf8 = new Utf8();
  private textSoFar = '';
  private seen = 0;
  private started = false;
  private queue: { type: 'call'; name: string; args: string }[] = [];

  constructor(model: Model) {
    this.name = model.name;
    this.syntax = h(() => hostTools.syntax(model.name));
    this.stops = new Set(h(() => hostGrammar.stopIds(model.name)));
  }
  /** Forget everything fed so far. */
  reset(): void { this.utf8 = new Utf8(); this.textSoFar = ''; this.seen = 0; this.started = false; this.queue = []; }
  /** Whether a call has started and not yet completed. */
  get inside(): boolean { return this.started; }
  /** Consume tokens: 'call' when a call completes, 'start' when one begins, else 'idle'. */
  feed(tokens: Iterable<number>): ToolEvent {
    if (this.syntax === null) return { type: 'idle' };
    const list = Array.from(tokens);
    const cut = list.findIndex((t) => this.stops.has(t));
    const visible = cut < 0 ? list : list.slice(0, cut);
    if (visible.length) {
      for (const piece of h(() => hostModel.tokenBytes(this.name, visible))) this.textSoFar += this.utf8.decode(piece);
    }
    const calls = h(() => hostTools.parseCalls(this.name, this.textSoFar));
    for (const [name, args] of calls.slice(this.seen)) this.queue.push({ type: 'call', name, args });
    this.seen = calls.length;
    const opened = this.opened(this.syntax);
    if (this.queue.length) {
      this.started = opened;
      return this.queue.shift()!;
    }
    if (opened && !this.started) {
      this.started = true;
      return { type: 'start' };
    }
    return { type: 'idle' };
  }
  private opened(syntax: ToolCallSyntax): boolean {
    if (syntax.begin) return count(this.textSoFar, syntax.begin) > count(this.textSoFar, syntax.end);
    return this.textSoFar.replace(/^\s+/, '').startsWith('{') && this.seen === 0;
  }
}

const count = (text: string, part: string) => (part ? text.split(part).length - 1 : 0);
