// The ReAct protocol (the TypeScript twin of agent-react/react.py): actions, tools and
// observations word for word as the Python inferlet and benchmarks/agents.py run them.
//
// The tools run offline: `search` looks the query up in a small encyclopedia, `lookup` finds a
// word in the page the last search returned, `finish` ends the task. Every call (`finish`
// aside) waits `delay` seconds first, standing in for a real tool's latency.

export const SYSTEM =
  "You are a ReAct agent. Work in turns. In each turn write one line 'Thought: <reasoning>' and then "
  + "one or more lines 'Action: <tool>[<input>]'. Tools: search[topic] returns a short article, "
  + "lookup[word] returns the sentence of the last article holding that word, finish[answer] gives the "
  + "final answer. After each turn you get 'Observation: ...'.";

const PAGES: Record<string, string> = {
  'eiffel tower': 'The Eiffel Tower is a wrought-iron lattice tower in Paris. It was completed in 1889 '
    + "for the World's Fair and is 330 metres tall.",
  'statue of liberty': 'The Statue of Liberty is a copper statue on Liberty Island in New York. It was '
    + 'dedicated in 1886 and was a gift from France.',
  paris: 'Paris is the capital of France, on the Seine. About 2.1 million people live in the city.',
  'new york': 'New York City is the most populous city in the United States, with about 8.3 million people.',
  'kv cache': 'A KV cache keeps the keys and values of past tokens so a transformer decodes each new '
    + 'token without recomputing the prefix.',
};

export type Call = [name: string, arg: string];

// Python's whitespace (`str.isspace`, `\s` in `re`), not JavaScript's: the twins must agree on
// whatever text the model writes.
const WS = '\\t\\n\\v\\f\\r\\x1c-\\x20\\x85\\xa0\\u1680\\u2000-\\u200a\\u2028\\u2029\\u202f\\u205f\\u3000';
const ACTION = new RegExp(`Action:[${WS}]*([A-Za-z_]+)\\[([^\\]\\n]{0,200})\\]`, 'g');
const EDGES = new RegExp(`^[${WS}]+|[${WS}]+$`, 'g');
const RUNS = new RegExp(`[${WS}]+`);

/** The first `n` code points of `s` (Python's `s[:n]`). */
const head = (s: string, n: number) => Array.from(s).slice(0, n).join('');
/** Python's `s.strip()`. */
const strip = (s: string) => s.replace(EDGES, '');
/** Python's `" ".join(s.split())`. */
const squash = (s: string) => s.split(RUNS).filter(Boolean).join(' ');

/** The turn's actions, at most `most`; a turn naming none searches for its own text. */
export function actions(text: string, most: number): Call[] {
  const found = Array.from(text.matchAll(ACTION), (m): Call => [m[1].toLowerCase(), strip(m[2])])
    .slice(0, Math.max(1, most));
  return found.length ? found : [['search', head(squash(text), 60)]];
}

/** The answer of a `finish` action, null without one. */
export function finished(calls: Call[]): string | null {
  const call = calls.find(([name]) => name === 'finish');
  return call === undefined ? null : call[1];
}

export function search(query: string): string {
  const q = query.toLowerCase();
  const hits = Object.entries(PAGES).filter(([topic]) => q.includes(topic) || topic.includes(q));
  if (hits.length) return hits[0][1];
  const words = new Set(q.match(/[a-z]+/g) ?? []);
  const shared = (topic: string) => topic.split(' ').filter((w, i, all) => words.has(w) && all.indexOf(w) === i).length;
  let best = Object.keys(PAGES)[0];
  for (const topic of Object.keys(PAGES)) if (shared(topic) > shared(best)) best = topic;
  return shared(best) ? PAGES[best] : `Could not find [${head(query, 60)}].`;
}

export function lookup(word: string, page: string): string {
  const sentences = page.split('.').filter((s) => s.toLowerCase().includes(word.toLowerCase()) && strip(word))
    .map(strip);
  return sentences.length ? sentences[0] + '.' : `No sentence with [${head(word, 40)}].`;
}

/** One agent's tools; `lookup` reads the page its last `search` returned. */
export class Tools {
  private page = '';
  constructor(readonly delay: number) {}

  async call(name: string, arg: string): Promise<string> {
    await new Promise<void>((done) => setTimeout(done, this.delay * 1000));
    if (name === 'search') {
      this.page = search(arg);
      return this.page;
    }
    if (name === 'lookup') return lookup(arg, this.page);
    return `Unknown tool '${head(name, 40)}'; use search, lookup or finish.`;
  }

  /** Every call at once (a turn's actions are independent); results in call order. */
  run(calls: Call[]): Promise<string[]> {
    return Promise.all(calls.map(([name, arg]) => this.call(name, arg)));
  }
}

export function observation(results: string[]): string {
  return 'Observation: ' + results.join(' | ');
}
