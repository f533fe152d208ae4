// The chat decoder's UTF-8: split anywhere, invalid bytes replaced as the WHATWG decoder (and
// Python's "replace") replaces them.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { Utf8 } from '../src/chat';

function rand(seed: number) { return () => ((seed = (seed * 1103515245 + 12345) & 0x7fffffff) / 0x7fffffff); }

test('valid text split at every byte decodes to itself', () => {
  const bytes = new TextEncoder().encode('héllo 世界 🎉 done');
  for (let cut = 0; cut <= bytes.length; cut++) {
    const d = new Utf8();
    assert.equal(d.decode(bytes.slice(0, cut)) + d.decode(bytes.slice(cut), true), 'héllo 世界 🎉 done');
  }
});

test('random bytes in random pieces decode as the standard decoder does', () => {
  const r = rand(7);
  for (let trial = 0; trial < 300; trial++) {
    const n = 1 + Math.floor(r() * 24);
    const pool = [0x41, 0x80, 0xbf, 0xc2, 0xc0, 0xe0, 0xed, 0xef, 0xf0, 0xf4, 0xf5, 0xff, 0xa0, 0x9f, 0x90, 0x8f];
    const bytes = Uint8Array.from({ length: n }, () => pool[Math.floor(r() * pool.length)]);
    const want = new TextDecoder('utf-8').decode(bytes);
    const d = new Utf8();
    let got = '', at = 0;
    while (at < n) { const k = 1 + Math.floor(r() * 4); got += d.decode(bytes.slice(at, at + k)); at += k; }
    got += d.decode([], true);
    assert.equal(got, want, `bytes ${Array.from(bytes, (b) => b.toString(16)).join(' ')}`);
  }
});
