// The host's scratch paths stay inside the user's scratch directory.
import runtime from 'pie:inferlet/runtime@0.1.0';
export async function main() {
  const out = { inside: runtime.scratchPath('notes/a.txt') };
  for (const rel of ['../../etc/passwd', '/etc/passwd']) {
    try {
      out[rel] = runtime.scratchPath(rel);
    } catch (e) {
      out[rel] = `refused: ${e.payload.kind}`;
    }
  }
  return out;
}
