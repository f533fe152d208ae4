import { Model } from 'inferlet';
export async function main(): Promise<string> {
  await Promise.resolve();
  Model.load('no-such-model');
  return 'unreachable';
}
