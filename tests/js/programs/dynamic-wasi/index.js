// A computed import of WASI (to reach its filesystem) is a native promise the sandbox never settles.
export async function main() {
  const name = ['wasi:filesystem', 'preopens@0.2.6'].join('/');
  const m = await import(name);
  return Object.keys(m);
}
