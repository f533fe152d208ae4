/** A host call failed: `kind` is the engine's error class in kebab-case (`invalid-input`, ...). */
export class PieError extends Error {
  readonly kind: string;
  constructor(kind: string, message: string) {
    super(`${kind}: ${message}`);
    this.kind = kind;
    this.name = 'PieError';
  }
}

/** `e` as an Error: the host's `error` record becomes a PieError. */
export function asError(e: unknown): unknown {
  // componentize-qjs throws an Error whose `payload` is the WIT error record
  if (e instanceof Error && (e as any).payload !== undefined && !(e instanceof PieError)) e = (e as any).payload;
  if (e !== null && typeof e === 'object' && !(e instanceof Error) && 'kind' in e && 'message' in e) {
    return new PieError(String((e as any).kind), String((e as any).message));
  }
  return e;
}

/** Run a host call, raising its error record as a PieError. */
export function h<T>(f: () => T): T {
  try { return f(); } catch (e) { throw asError(e); }
}
