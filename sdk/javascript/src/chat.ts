import hostModel from 'pie:inferlet/model@0.1.0';
import { h } from './errors';
import type { Model } from './model';

export type ChatEvent =
  | { type: 'idle' } | { type: 'delta'; text: string } | { type: 'done'; text: string } | { type: 'interrupt'; token: number };

/** Incremental UTF-8 decoding, invalid sequences replaced by U+FFFD per maximal subpart. */
export class Utf8 {
  private rest: number[] = [];
  decode(bytes: ArrayLike<number>, final = false): string {
    const b = this.rest.concat(Array.from(bytes));
    let out = '', i = 0;
    while (i < b.length) {
      const c = b[i];
      let need = 0, cp = 0, lo = 0x80, hi = 0xbf;
      if (c < 0x80) { out += String.fromCharCode(c); i++; continue; }
      if (c >= 0xc2 && c <= 0xdf) { need = 1; cp = c & 0x1f; }
      else if (c >= 0xe0 && c <= 0xef) { need = 2; cp = c & 0x0f; if (c === 0xe0) lo = 0xa0; if (c === 0xed) hi = 0x9f; }
      else if (c >= 0xf0 && c <= 0xf4) { need = 3; cp = c & 0x07; if (c === 0xf0) lo = 0x90; if (c === 0xf4) hi = 0x8f; }
      else { out += '\ufffd'; i++; continue; }
      let j = 1;
      for (; j <= need && i + j < b.length; j++) {
        const x = b[i + j];
        if (x < lo || x > hi) break;
        lo = 0x80; hi = 0xbf;
        cp = (cp << 6) | (x & 0x3f);
      }
      if (j > need) { out += String.fromCodePoint(cp); i += need + 1; continue; }
      if (i + j >= b.length && !final) { this.rest = b.slice(i); return out; }
      out += '\ufffd';
      i += j;
    }
    this.rest = [];
    return out;
  }
}

/** Turns generated token ids into text events, safe across split UTF-8 sequences. */
export class Decoder {
  private readonly name: string;
  private readonly stops: Set<number>;
  private readonly special: Set<number>;
  private utf8 = new Utf8();
  private parts: string[] = [];
  constructor(model: Model) {
    this.name = model.name;
    this.stops = new Set(h(() => hostModel.stopTokens(model.name)));
    this.special = new Set(h(() => hostModel.specialTokens(model.name))[0]);
  }
  reset(): void { this.utf8 = new Utf8(); this.parts = []; }
  feed(tokens: Iterable<number>): ChatEvent {
    const list = Array.from(tokens);
    const pieces: ArrayLike<number>[] = list.length ? h(() => hostModel.tokenBytes(this.name, list)) : [];
    const delta: string[] = [];
    for (let i = 0; i < list.length; i++) {
      const t = list[i];
      if (this.stops.has(t)) {
        delta.push(this.utf8.decode([], true));
        this.parts.push(...delta);
        const text = this.parts.join('');
        this.reset();
        return { type: 'done', text };
      }
      if (this.special.has(t)) { this.parts.push(...delta); return { type: 'interrupt', token: t }; }
      delta.push(this.utf8.decode(pieces[i]));
    }
    const text = delta.join('');
    this.parts.push(text);
    return text ? { type: 'delta', text } : { type: 'idle' };
  }
  text(): string { return this.parts.join(''); }
}

const piece = (model: Model, role: string, text = '') => h(() => hostModel.chatTokens(model.name, role, text)) as number[];
export const system = (model: Model, message: string) => piece(model, 'system', message);
export const user = (model: Model, message: string) => piece(model, 'user', message);
export const assistant = (model: Model, message: string) => piece(model, 'assistant', message);
export const cue = (model: Model) => piece(model, 'cue');
export const seal = (model: Model) => piece(model, 'seal');
export const stopTokens = (model: Model) => h(() => hostModel.stopTokens(model.name)) as number[];
