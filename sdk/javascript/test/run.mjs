// Runs the SDK's tests under node: each test/*.test.ts is bundled with esbuild (the path of its
// JS API is argv[2]; Pie installs it in its cache, not here), the host imports `pie:inferlet/*`
// replaced by objects the tests fill in (globalThis.__fakeHost[interface]), then `node --test`.
import { readdirSync, mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, dirname } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';
import { spawnSync } from 'node:child_process';

const esbuild = await import(pathToFileURL(process.argv[2]).href);
const here = dirname(fileURLToPath(import.meta.url));
const out = mkdtempSync(join(tmpdir(), 'pie-sdk-test-'));
const fakeHost = {
  name: 'fake-host',
  setup(build) {
    build.onResolve({ filter: /^pie:inferlet\// }, (a) => ({ path: a.path.split('/')[1].split('@')[0], namespace: 'fake' }));
    build.onLoad({ filter: /.*/, namespace: 'fake' }, (a) => ({
      contents: `const h = (globalThis.__fakeHost ??= {}); export default (h[${JSON.stringify(a.path)}] ??= {});`,
    }));
  },
};
const files = [];
for (const name of readdirSync(here).filter((f) => f.endsWith('.test.ts'))) {
  const outfile = join(out, name.replace(/\.ts$/, '.mjs'));
  await esbuild.build({ entryPoints: [join(here, name)], bundle: true, format: 'esm', platform: 'node',
                        target: 'es2016', outfile, plugins: [fakeHost], logLevel: 'error' });
  files.push(outfile);
}
const done = spawnSync(process.execPath, ['--test', ...files], { stdio: 'inherit' });
process.exit(done.status ?? 1);
