// The streaming reasoning decoder: `import { reasoning } from 'inferlet'`.
//
// Models that think before they answer (Qwen 3: `<think>\n...\n</think>\n\n`) write their
// reasoning between two marker tokens. `Decoder` watches generated tokens for them and reports
// the reasoning as it streams; the answer after the end marker is left to `chat.Decoder`.
import hostModel from 'pie:inferlet/model@0.1.0';
import { Utf8 } from './chat';
import { h } from './errors';
import type { Model } from './model';

export type ReasoningEvent =
  | { type: 'idle' } | { type: 'start' } | { type: 'delta'; text: string } | { type: 'end'; text: string };

/** Turns generated token ids into reasoning events, safe across split UTF-8 sequences.
 *
 * One event per `feed`. When a batch holds more than one boundary the most final one is
 * reported: 'end' over 'start'; reasoning text that follows a start in the same batch comes with
 * the next 'delta' (and always in 'end''s full text). Tokens after the end marker are not
 * reasoning and are ignored until the next start marker. A model whose chat format has no
 * reasoning markers never leaves 'idle'. */
export class Decoder {
  private readonly name: string;
  /** The `[start, end]` marker token ids watched for, or null. */
  readonly markers: [number, number] | null;
  private utf8 = new Utf8();
  private isInside = false;
  private parts: string[] = [];
  private pending: string[] = [];

  /** Watch `model`'s generations; `markers` (default: the chat format's) are `[start, end]` ids. */
  constructor(model: Model, markers?: [number, number] | null) {
    this.name = model.name;
    this.markers = markers ?? h(() => hostModel.reasoningMarkers(model.name));
  }
  /** Whether the decoder is between a start marker and its end marker. */
  get inside(): boolean { return this.isInside; }
  /** Forget everything fed so far (back to outside reasoning). */
  reset(): void { this.utf8 = new Utf8(); this.isInside = false; this.parts = []; this.pending = []; }
  /** Consume tokens: 'end' (with the whole reasoning) at the end marker, 'start' at the start
   * marker, else 'delta' with the newly complete reasoning text ('idle' if none). */
  feed(tokens: Iterable<number>): ReasoningEvent {
    const list = Array.from(tokens);
    if (this.markers === null || !list.length) return { type: 'idle' };
    const [start, end] = this.markers;
    if (!this.isInside && !list.includes(start)) return { type: 'idle' };
    const pieces = h(() => hostModel.tokenBytes(this.name, list));
    let started = false;
    for (let i = 0; i < list.length; i++) {
      const t = list[i];
      if (!this.isInside) {
        if (t === start) { this.isInside = true; started = true; }
        continue;
      }
      if (t === end) {
        this.pending.push(this.utf8.decode([], true));
        this.parts.push(...this.pending);
        const text = this.parts.join('');
        this.reset();
        return { type: 'end', text };
      }
      if (t !== start) this.pending.push(this.utf8.decode(pieces[i])); // a repeated start marker is not text
    }
    if (started) return { type: 'start' };
    const text = this.pending.join('');
    this.parts.push(...this.pending);
    this.pending = [];
    return text ? { type: 'delta', text } : { type: 'idle' };
  }
  /** Reasoning decoded since the last start marker (incomplete bytes excluded). */
  text(): string { return this.parts.join('') + this.pending.join(''); }
}
