// Generated from wit/ by sdk/javascript/typegen/gen-host-types.mjs (jco-transpile guest types,
// mapped to componentize-qjs's values). Do not edit: change wit/ and regenerate.
declare module 'pie:inferlet/types@0.1.0' {
  /**
   * A JSON value, JSON-encoded (``null`` for Python's None).
   */
  export type Json = string;
  /**
   * Which exception class a host call raised (the class name in kebab-case); a class not
   * listed here crosses as its nearest listed base.
   * # Variants
   * 
   * ## `"pie-error"`
   * 
   * ## `"invalid-input"`
   * 
   * ## `"out-of-pages"`
   * 
   * ## `"unsupported"`
   * 
   * ## `"not-found"`
   * 
   * ## `"backend-error"`
   * 
   * ## `"contract-error"`
   * 
   * ## `"mcp-error"`
   * 
   * ## `"exception"`
   * 
   * ## `"value-error"`
   * 
   * ## `"type-error"`
   * 
   * ## `"key-error"`
   * 
   * ## `"index-error"`
   * 
   * ## `"lookup-error"`
   * 
   * ## `"runtime-error"`
   * 
   * ## `"permission-error"`
   * 
   * ## `"timeout-error"`
   * 
   * ## `"not-implemented-error"`
   * 
   * ## `"attribute-error"`
   * 
   * ## `"overflow-error"`
   * 
   * ## `"zero-division-error"`
   * 
   * ## `"arithmetic-error"`
   * 
   * ## `"memory-error"`
   * 
   * ## `"os-error"`
   */
  export type ErrorKind = 'pie-error' | 'invalid-input' | 'out-of-pages' | 'unsupported' | 'not-found' | 'backend-error' | 'contract-error' | 'mcp-error' | 'exception' | 'value-error' | 'type-error' | 'key-error' | 'index-error' | 'lookup-error' | 'runtime-error' | 'permission-error' | 'timeout-error' | 'not-implemented-error' | 'attribute-error' | 'overflow-error' | 'zero-division-error' | 'arithmetic-error' | 'memory-error' | 'os-error';
  /**
   * The error a host call failed with: its class and its message (which says what to fix).
   */
  export interface Error {
    kind: ErrorKind,
    message: string,
  }
  /**
   * How a sample row picks its token(s) (`SamplerKind`).
   * # Variants
   * 
   * ## `"argmax"`
   * 
   * ## `"top-k"`
   * 
   * ## `"top-p"`
   * 
   * ## `"min-p"`
   * 
   * ## `"top-k-top-p"`
   * 
   * ## `"multinomial"`
   */
  export type SamplerKind = 'argmax' | 'top-k' | 'top-p' | 'min-p' | 'top-k-top-p' | 'multinomial';
  /**
   * What a probe row reads at one input position (`ProbeKind`).
   * # Variants
   * 
   * ## `"logits"`
   * 
   * ## `"distribution"`
   * 
   * ## `"logprobs"`
   * 
   * ## `"entropy"`
   * 
   * ## `"embedding"`
   */
  export type ProbeKind = 'logits' | 'distribution' | 'logprobs' | 'entropy' | 'embedding';
  /**
   * Sample one input row of a forward pass (`SampleSpec`).
   */
  export interface SampleSpec {
    /**
     * Row, relative to the pass's input tokens.
     */
    index: number,
    kind: SamplerKind,
    temperature: number,
    /**
     * 0 = no top-k filter.
     */
    topK: number,
    topP: number,
    minP: number,
    /**
     * Tokens drawn (more than one only for multinomial).
     */
    draws: number,
    /**
     * 0 = the engine's generator.
     */
    seed: number,
    /**
     * The allowed vocabulary packed 8 tokens per byte, little bit order; none = no mask.
     */
    logitMask?: Uint8Array | null,
  }
  /**
   * Probe one input row of a forward pass (`ProbeSpec`).
   */
  export interface ProbeSpec {
    index: number,
    kind: ProbeKind,
    temperature: number,
    /**
     * Top-k of a distribution probe; 0 = all.
     */
    k: number,
    /**
     * Tokens a logprobs probe reads, in order.
     */
    tokenIds: number[],
    /**
     * The sample (position in `samples`) whose logit mask applies, or -1 for the raw logits.
     */
    maskedBy: number,
  }
  /**
   * One probe's value; the case is the probe's kind.
   */
  export type ProbeValue = ProbeValueLogits | ProbeValueDistribution | ProbeValueLogprobs | ProbeValueEntropy | ProbeValueEmbedding;
  /**
   * Raw logits, float32 little-endian, 4 bytes per vocabulary entry.
   */
  export interface ProbeValueLogits {
    tag: 'logits',
    val: Uint8Array,
  }
  /**
   * Top-k token ids and their probabilities, most probable first.
   */
  export interface ProbeValueDistribution {
    tag: 'distribution',
    val: [number[], number[]],
  }
  /**
   * Log-probabilities of the probe's token ids, in their order.
   */
  export interface ProbeValueLogprobs {
    tag: 'logprobs',
    val: number[],
  }
  /**
   * Entropy in nats of the row's distribution.
   */
  export interface ProbeValueEntropy {
    tag: 'entropy',
    val: number,
  }
  /**
   * The row's final hidden state.
   */
  export interface ProbeValueEmbedding {
    tag: 'embedding',
    val: number[],
  }
  /**
   * What a forward pass returned (`RequestOutput`).
   */
  export interface RequestOutput {
    /**
     * Token ids drawn per sample, in the order of `samples`.
     */
    tokens: Array<number[]>,
    /**
     * One value per probe, in the order of `probes`.
     */
    probes: Array<ProbeValue>,
    /**
     * Drafts the KV cache kept, for a pass that verified drafts.
     */
    draftsKept: number,
  }
  /**
   * A grammar as text (`GrammarSource`).
   */
  export interface GrammarSource {
    /**
     * How `text` is read: json_schema, json, regex, gbnf, lark or structural_tag.
     */
    kind: string,
    text: string,
    /**
     * JSON kinds only: allow any whitespace between JSON tokens.
     */
    whitespace: boolean,
  }
  /**
   * How a model writes tool calls (`ToolCallSyntax`).
   */
  export interface ToolCallSyntax {
    /**
     * "qwen" (marked blocks) or "llama" (a bare JSON object).
     */
    style: string,
    begin: string,
    end: string,
    argsKey: string,
    reasoning: boolean,
  }
  
  export class Adapter implements Disposable {
    /**
     * This type does not have a public constructor.
     */
    private constructor();
    [Symbol.dispose](): void;
  }
  
  export class ChatBuilder implements Disposable {
    /**
     * This type does not have a public constructor.
     */
    private constructor();
    [Symbol.dispose](): void;
  }
  
  export class Context implements Disposable {
    /**
     * This type does not have a public constructor.
     */
    private constructor();
    [Symbol.dispose](): void;
  }
  
  export class Matcher implements Disposable {
    /**
     * This type does not have a public constructor.
     */
    private constructor();
    [Symbol.dispose](): void;
  }
  
  export class McpSession implements Disposable {
    /**
     * This type does not have a public constructor.
     */
    private constructor();
    [Symbol.dispose](): void;
  }
  
  export class Model implements Disposable {
    /**
     * This type does not have a public constructor.
     */
    private constructor();
    [Symbol.dispose](): void;
  }
  
  export class Subscription implements Disposable {
    /**
     * This type does not have a public constructor.
     */
    private constructor();
    [Symbol.dispose](): void;
  }
}
