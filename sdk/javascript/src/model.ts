import model from 'pie:inferlet/model@0.1.0';
import { h } from './errors';

/** The model's tokenizer. */
export class Tokenizer {
  constructor(readonly name: string) {}
  encode(text: string): Uint32Array { return Uint32Array.from(h(() => model.tokenize(this.name, text))); }
  decode(tokens: Iterable<number>): string { return h(() => model.detokenize(this.name, Array.from(tokens))); }
  vocabs(): [Uint32Array, Uint8Array[]] {
    const [ids, bytes] = h(() => model.vocabs(this.name));
    return [Uint32Array.from(ids), bytes.map((b: ArrayLike<number>) => Uint8Array.from(b))];
  }
  specialTokens(): [Uint32Array, Uint8Array[]] {
    const [ids, bytes] = h(() => model.specialTokens(this.name));
    return [Uint32Array.from(ids), bytes.map((b: ArrayLike<number>) => Uint8Array.from(b))];
  }
  splitRegex(): string { return h(() => model.splitRegex(this.name)); }
}

/** A loaded model. */
export class Model {
  private constructor(readonly name: string) {}
  /** Bind to the loaded model `name` (throws PieError not-found if none). */
  static load(name: string): Model {
    h(() => model.resolve(name));
    return new Model(name);
  }
  tokenizer(): Tokenizer { return new Tokenizer(this.name); }
  /** Rows of the model's output layer: valid token ids are below it. */
  get vocabSize(): number { return h(() => model.vocabSize(this.name)); }
}
