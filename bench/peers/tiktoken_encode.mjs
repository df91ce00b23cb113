// The peer: the npm `tiktoken` package (OpenAI's Rust tiktoken compiled to
// WASM), single-threaded, on the same text and vocabulary.
//   node tiktoken_encode.mjs ENCODING TEXT_FILE [REPEATS]   (needs tiktoken@1.0.22)
import fs from "node:fs";
import { createRequire } from "node:module";
const require = createRequire(import.meta.url);
const { Tiktoken } = require("tiktoken/lite");
const [name, file, repeatsArg] = process.argv.slice(2);
const spec = require(`tiktoken/encoders/${name}.json`);
const enc = new Tiktoken(spec.bpe_ranks, spec.special_tokens, spec.pat_str);
const text = fs.readFileSync(file, "utf8");
const bytes = Buffer.byteLength(text, "utf8");
let best = Infinity, ids;
for (let r = 0; r < Number(repeatsArg || 5); r++) {
  const t0 = process.hrtime.bigint();
  ids = enc.encode_ordinary(text);
  best = Math.min(best, Number(process.hrtime.bigint() - t0) / 1e9);
}
let checksum = 0n;
for (const id of ids) checksum = (checksum * 31n + BigInt(id)) & 0xffffffffffffffffn;
console.log(`tiktoken ${(bytes / best / 1e6).toFixed(2).padStart(8)} MB/s  ${bytes} bytes  ${ids.length} tokens  checksum ${checksum}`);
enc.free();
