// The npm peers of shard's uuidv7, ulid and tsid layouts, for tests/test_id_peers.py:
// npm `uuid` 14.0.3 (v7), `ulid` 3.0.2 and `tsid-ts` 0.0.9, pinned in package.json.
//
// Usage:  node ids_oracle.mjs < request.json > answer.json
//
// The request: {"parse": {"uuidv7": [text...], "ulid": [text...], "tsid": [text...],
//                         "tsid_decimal": [decimal...]},
//               "make": {"uuidv7": [[msecs, seq, hex32 of 16 random bytes]...],
//                        "ulid": [[ms, "random"|"min"|"max"]...],
//                        "ulid_monotonic": [[ms, count]...],
//                        "tsid": [[ms since the TSID epoch, the 22 low bits]...],
//                        "tsid_now": [[node, node bits, count]...]}}
// The answer: how each library reads each ID it was given ("parse": uuid: [valid, version,
// ms, variant bits]; ulid: [valid, ms]; tsid: [ms, random, decimal]), and the IDs each made
// ("made"), by the libraries' own functions: uuid's v7() with its msecs, seq and random
// options; ulid's encodeTime + its random characters, and its monotonicFactory; tsid-ts's
// TSID number to canonical string, and its TSIDGenerator.
import { v7, parse, validate, version } from 'uuid';
import { decodeTime, encodeTime, isValid, monotonicFactory, ulid } from 'ulid';
import tsidPackage from 'tsid-ts';

const { TSID, TSIDGenerator } = tsidPackage;

function readUuid(text) {
  if (!validate(text)) return [false, 0, 0, 0];
  const bytes = parse(text);
  let ms = 0;
  for (let i = 0; i < 6; i++) ms = ms * 256 + bytes[i];
  return [true, version(text), ms, bytes[8] >> 6];
}

function readUlid(text) {
  if (!isValid(text)) return [false, 0];
  return [true, decodeTime(text)];
}

function readTsid(tsid) {
  return [tsid.timestamp, tsid.random, tsid.number.toString()];
}

function fromHex(hex) {
  return Uint8Array.from(hex.match(/../g).map((b) => parseInt(b, 16)));
}

function makeUlid(ms, kind) {
  const prng = kind === 'min' ? () => 0 : kind === 'max' ? () => 0.99999 : undefined;
  // ulid(0) would mean "now": the epoch is written with encodeTime, ulid's own.
  if (ms === 0) return encodeTime(0, 10) + ulid(1, prng).slice(10);
  return ulid(ms, prng);
}

function main(request) {
  const p = request.parse || {};
  const m = request.make || {};
  const made = {
    uuidv7: (m.uuidv7 || []).map(([msecs, seq, random]) => v7({ msecs, seq, random: fromHex(random) })),
    ulid: (m.ulid || []).map(([ms, kind]) => makeUlid(ms, kind)),
    ulid_monotonic: (m.ulid_monotonic || []).flatMap(([ms, count]) => {
      const next = monotonicFactory();
      return Array.from({ length: count }, () => next(ms));
    }),
    tsid: (m.tsid || []).map(([ms, low]) => new TSID((BigInt(ms) << 22n) | BigInt(low)).toString()),
    tsid_now: (m.tsid_now || []).flatMap(([node, bits, count]) => {
      const g = new TSIDGenerator(node, bits);
      return Array.from({ length: count }, () => g.create().toString());
    }),
  };
  return {
    parse: {
      uuidv7: (p.uuidv7 || []).map(readUuid),
      ulid: (p.ulid || []).map(readUlid),
      tsid: (p.tsid || []).map((t) => readTsid(TSID.fromString(t))),
      // tsid-ts's own decimal parser goes through a float (digits past 2^53 are lost): the
      // number is read with BigInt, and the TSID made of it.
      tsid_decimal: (p.tsid_decimal || []).map((d) => [...readTsid(new TSID(BigInt(d))), new TSID(BigInt(d)).toString()]),
    },
    made,
  };
}

const chunks = [];
process.stdin.on('data', (c) => chunks.push(c));
process.stdin.on('end', () => {
  process.stdout.write(JSON.stringify(main(JSON.parse(Buffer.concat(chunks).toString('utf8')))));
});
