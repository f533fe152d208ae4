// JSON extraction: the reply is held to a JSON Schema, so it always parses and conforms (the
// TypeScript twin of json-extraction). `g.collectJson({ schema })` attaches the schema as a
// constraint, runs the generator to the end and parses the reply.
import { Context, Model, Sampler, jsonSchema, runtime } from 'inferlet';

const PERSON = {
  type: 'object',
  properties: {
    name: { type: 'string', maxLength: 60 },
    born: { type: 'integer', minimum: 0, maximum: 2100 },
    city: { type: 'string', maxLength: 40 },
    known_for: { type: 'array', items: { type: 'string', maxLength: 60 }, maxItems: 3 },
    colleagues: { type: 'array', items: { type: 'string', maxLength: 40 }, maxItems: 3 },
  },
  required: ['name', 'born', 'known_for'],
};

/** JSON text as Python's json.dumps writes it (", " and ": "), so the prompt is the twin's. */
function dumps(v: unknown): string {
  if (Array.isArray(v)) return `[${v.map(dumps).join(', ')}]`;
  if (v !== null && typeof v === 'object') {
    return `{${Object.entries(v).map(([k, x]) => `${JSON.stringify(k)}: ${dumps(x)}`).join(', ')}}`;
  }
  return JSON.stringify(v);
}

export async function main(input: { text: string; schema?: string; max_tokens: number }) {
  const model = Model.load(runtime.models()[0]);
  let schema: object = PERSON;
  if (input.schema) {
    jsonSchema(input.schema); // a malformed schema fails here, saying what is wrong
    schema = JSON.parse(input.schema);
  }
  using ctx = new Context(model);
  ctx.system("Extract the requested facts from the user's text as JSON.");
  ctx.user(`Schema: ${dumps(schema)}\n\nText: ${input.text}`);
  const g = ctx.generate(Sampler.argmax(), { maxTokens: input.max_tokens });
  const value = await g.collectJson({ schema });
  return { value, schema, tokens: g.tokensGenerated };
}
