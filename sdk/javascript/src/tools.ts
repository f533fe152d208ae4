import hostTools from 'pie:inferlet/tools@0.1.0';
import { h } from './errors';
import { Grammar, Matcher } from './grammar';
import type { Model } from './model';

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
/** A Matcher over the model's native tool-call format, or undefined when it has none. */
export function nativeMatcher(model: Model, schemas: Iterable<object | string>, choice = 'auto'): Matcher | undefined {
  const source = h(() => hostTools.callGrammar(model.name, schemasJson(schemas), choice));
  if (source === null || source === undefined) return undefined;
  return new Matcher(Grammar.fromSource(source), model);
}
