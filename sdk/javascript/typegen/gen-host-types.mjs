// Generate the TypeScript types of the host imports (`pie:inferlet/*`) from Pie's WIT package.
//
//   npm ci --ignore-scripts && node gen-host-types.mjs ../../../wit ../src/host   (in this folder)
//
// jco-transpile parses the WIT (wit-parser, as wasm) and writes guest types, one `declare
// module 'pie:inferlet/<iface>@0.1.0'` per interface. Those types describe jco's value mapping;
// the SDK runs on componentize-qjs, whose mapping differs in three ways, rewritten here:
//   - u64 / s64 are numbers, not bigints (`bigint` -> `number`, list<u64> -> `number[]`);
//   - lists of numbers other than u8/s8 lift to plain arrays (and lower from arrays), not typed
//     arrays (`Uint32Array`, `Float32Array`, ... -> `number[]`); list<u8> stays `Uint8Array`;
//   - `option<T>`'s none is null (`T | undefined` -> `T | null`; an optional record field
//     `f?: T` -> `f?: T | null`).
// Anything the rewrite does not know fails the run, so a new WIT construct cannot slip through
// with jco's meaning. The output is committed (`sdk/javascript/src/host/`); tests/js regenerates
// it and fails on any difference.
import { mkdirSync, writeFileSync, rmSync } from 'node:fs';
import { createRequire } from 'node:module';
import { dirname, join, resolve } from 'node:path';
import { pathToFileURL } from 'node:url';

const [witArg, outArg] = process.argv.slice(2);
if (!witArg || !outArg) {
  console.error('usage: node gen-host-types.mjs <wit dir> <out dir>');
  process.exit(2);
}
const witDir = resolve(witArg);
const outDir = resolve(outArg);

// jco-transpile's WIT reader is a wasm component reading files through preview2-shim, which
// (0.26) preopens nothing by default: give it the WIT folder, read-only in spirit, nothing else.
// Packages resolve from the working directory (where `npm ci` installed them).
const transpilePath = createRequire(join(process.cwd(), 'gen.js')).resolve('@bytecodealliance/jco-transpile');
const transpile = pathToFileURL(transpilePath).href;
const shim = createRequire(transpilePath).resolve('@bytecodealliance/preview2-shim/filesystem');
const fs = await import(pathToFileURL(shim).href);
fs._setPreopens({ [witDir]: witDir });
const { generateGuestTypes } = await import(transpile);
const files = await generateGuestTypes(witDir, { worldName: 'inferlet', outDir: '' });

const HEADER = '// Generated from wit/ by sdk/javascript/typegen/gen-host-types.mjs (jco-transpile guest types,\n'
  + "// mapped to componentize-qjs's values). Do not edit: change wit/ and regenerate.\n";

const NUMERIC_ARRAYS = /\b(?:BigUint64Array|BigInt64Array|Uint16Array|Int16Array|Uint32Array|Int32Array|Float32Array|Float64Array)\b/g;

function toQjs(text) {
  let out = text
    .replace(NUMERIC_ARRAYS, 'number[]')
    .replace(/\bbigint\b/g, 'number')
    .replace(/ \| undefined\b/g, ' | null')
    .replace(/^(\s+\w+\?: )(.+),$/gm, (_, head, type) => `${head}${type} | null,`);
  const left = out.match(/\bbigint\b|\bundefined\b|\b\w+(?:64|32|16)Array\b|\bInt8Array\b/);
  if (left) throw new Error(`gen-host-types: no componentize-qjs mapping for '${left[0]}' in:\n${out}`);
  return HEADER + out;
}

rmSync(outDir, { recursive: true, force: true });
for (const [name, text] of Object.entries(files).sort(([a], [b]) => a.localeCompare(b))) {
  const path = join(outDir, name);
  mkdirSync(dirname(path), { recursive: true });
  writeFileSync(path, toQjs(typeof text === "string" ? text : new TextDecoder().decode(text)));
}
console.log(`wrote ${Object.keys(files).length} files to ${outDir}`);
