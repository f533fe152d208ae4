// A call number the engine never gave this instance: its result must be refused.
import inference from 'pie:inferlet/inference@0.1.0';
export async function main() {
  try {
    inference.forwardResult(987654);
  } catch (e) {
    return { refused: true, kind: e.payload.kind, message: e.payload.message };
  }
  return { refused: false };
}
