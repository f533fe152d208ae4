// What componentize-qjs hands the guest for each WIT shape that the generated host types
// (sdk/javascript/src/host) map differently from jco: u64, lists of numbers, bytes, option none.
import hostAdapter from 'pie:inferlet/adapter@0.1.0';
import hostModel from 'pie:inferlet/model@0.1.0';
import hostRuntime from 'pie:inferlet/runtime@0.1.0';
import hostMessaging from 'pie:inferlet/messaging@0.1.0';
import poll from 'pie:inferlet/poll@0.1.0';
const kind = (v) => (v === null ? 'null' : Array.isArray(v) ? 'array' : v instanceof Uint8Array ? 'Uint8Array' : typeof v);
export async function main() {
  const name = hostRuntime.models()[0];
  const call = hostMessaging.pull('host-values-nobody');
  const out = {
    u64: kind(call),
    listU32: kind(hostModel.tokenize(name, 'hi')),
    listU8: kind(hostModel.tokenBytes(name, [1])[0]),
    optionNone: kind(hostAdapter.openAdapter(name, 'no-such-adapter')),
    pollIndices: kind(poll.wait([call], 0)),
  };
  poll.cancel(call);
  return out;
}
