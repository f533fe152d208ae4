// The host's scratch paths stay inside the user's scratch directory, and name it as the guest
// sees it (/scratch), through the SDK or the raw import.
import hostRuntime from 'pie:inferlet/runtime@0.1.0';
import { runtime } from 'inferlet';
export async function main() {
  const out = {
    inside: hostRuntime.scratchPath('notes/a.txt'), dir: hostRuntime.scratchDir(),
    sdkPath: runtime.scratchPath('notes//b.txt'), sdkDir: runtime.scratchDir(),
  };
  for (const rel of ['../../etc/passwd', '/etc/passwd']) {
    try {
      out[rel] = hostRuntime.scratchPath(rel);
    } catch (e) {
      out[rel] = `refused: ${e.payload.kind}`;
    }
  }
  try {
    out.sdkEscape = runtime.scratchPath('../x');
  } catch (e) {
    out.sdkEscape = `refused: ${e.kind}`;
  }
  return out;
}
