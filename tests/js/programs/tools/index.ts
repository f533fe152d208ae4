// The tools helpers return what the Python SDK's return for the same schemas and values.
import { Model, runtime, tools } from 'inferlet';

const WEATHER = { name: 'weather', description: 'Weather in a city', parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] } };

export async function main() {
  const model = Model.load(runtime.models()[0]);
  return {
    equip: tools.equipPrefix(model, [WEATHER]),
    answer: tools.answerPrefix(model, 'weather', { temp: 21 }),
    matcher: tools.nativeMatcher(model, [WEATHER]) !== undefined,
  };
}
