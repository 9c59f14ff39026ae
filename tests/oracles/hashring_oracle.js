// Command-line oracle for the npm `hashring` package (pinned to 3.2.0 in package.json) in
// ketama mode, for tests that compare the `ketama` ring of `shard`:
//   new HashRing({name: weight, ...}, 'md5', {compatibility: 'ketama'}); ring.get(key)
// The answer is taken from ring.range(key, 1)[0], the same lookup as ring.get(key) without
// get's LRU cache: that cache is a plain object, so a key named "__proto__" corrupts it and
// later keys such as "valueOf" or "hasOwnProperty" get a wrong node from get(). Every other key
// gets the same answer from both (checked: a few thousand keys).
//
// Usage:  cp -r tests/oracles DIR && (cd DIR && npm install --no-audit --no-fund)
//         node DIR/hashring_oracle.js  < input  > output
// Input: line 1: space-separated "name:weight" pairs (the last ':' splits); then one key per
// line, hex-encoded (an empty line is the empty key). Output: one node name per key line.
//
// Which keys are comparable: hashring hashes `key + ''` with crypto's default string encoding,
// UTF-8. The hex bytes are decoded as UTF-8 here, so every key that is valid UTF-8 (ASCII
// included) is hashed over exactly its bytes, as `shard` does; a key that is not valid UTF-8
// gets U+FFFD replacements and is NOT comparable.
//
// Known differences from uhashring 2.5 (and from `shard`, which follows uhashring):
// - points per node: hashring uses Math.floor(w / W * 40 * N) in floating point, uhashring the
//   integer floor(40 * N * w / W); they differ when the float lands just under an integer:
//   equal weights with N = 7, 14, 28, 49, 56, 98, 103, 112, ... nodes (39 hashes each instead
//   of 40), or e.g. 3 nodes weighted 53:6:1 (105 hashes instead of 106 for the first);
// - a key whose hash equals a point exactly: hashring picks that point (first point >= hash),
//   uhashring the next one (first point > hash);
// - two nodes with an equal point: hashring keeps the earlier node, uhashring the later;
// - JS object key order puts integer-like names ("1", "20") first, in numeric order, which
//   changes the node order (only ties depend on it).
'use strict';

const HashRing = require('hashring');

function main(input) {
  const lines = input.split('\n');
  if (lines.length && lines[lines.length - 1] === '') lines.pop();
  if (!lines.length) throw new Error('missing the name:weight line');
  const servers = {};
  for (const pair of lines[0].trim().split(/ +/)) {
    const colon = pair.lastIndexOf(':');
    if (colon <= 0) throw new Error('expected name:weight, got ' + pair);
    servers[pair.slice(0, colon)] = parseInt(pair.slice(colon + 1), 10);
  }
  const ring = new HashRing(servers, 'md5', { compatibility: 'ketama' });
  const out = [];
  for (let i = 1; i < lines.length; i++) {
    const key = Buffer.from(lines[i].replace(/\r$/, '').trim(), 'hex').toString('utf8');
    out.push(ring.range(key, 1)[0]);
  }
  process.stdout.write(out.length ? out.join('\n') + '\n' : '');
}

const chunks = [];
process.stdin.on('data', (c) => chunks.push(c));
process.stdin.on('end', () => main(Buffer.concat(chunks).toString('utf8')));
