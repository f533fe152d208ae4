// The sandbox's WASI is for the runtime, not the inferlet: reaching for the filesystem is refused.
import preopens from 'wasi:filesystem/preopens@0.2.6';
export async function main() { return preopens.getDirectories().map((d) => d[1]); }
