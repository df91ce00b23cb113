// transformers.js's tokenizer (the npm fork @lenml/tokenizers, same code,
// no model runtime) encoding a text file: the peer for SentencePiece-style
// tokenizer.json files in bench/run_tokenizer_bench.sh.
//   node transformersjs_encode.mjs TOKENIZER_DIR TEXT_FILE [REPEATS]
// Prints MB/s, tokens and the same id checksum as orchard_bench_tokenizer.
import fs from "node:fs";
import { TokenizerLoader } from "@lenml/tokenizers";

const [dir, file, repeatsArg] = process.argv.slice(2);
const tokenizer = TokenizerLoader.fromPreTrained({
  tokenizerJSON: JSON.parse(fs.readFileSync(`${dir}/tokenizer.json`, "utf8")),
  tokenizerConfig: JSON.parse(fs.readFileSync(`${dir}/tokenizer_config.json`, "utf8")),
});
const text = fs.readFileSync(file, "utf8");
const bytes = Buffer.byteLength(text, "utf8");
let best = Infinity, ids = [];
for (let r = 0; r < Number(repeatsArg ?? 5); r++) {
  const t0 = process.hrtime.bigint();
  ids = tokenizer.encode(text, { add_special_tokens: false });
  best = Math.min(best, Number(process.hrtime.bigint() - t0) / 1e9);
}
let checksum = 0n;
for (const id of ids) checksum = (checksum * 31n + BigInt(id)) & 0xffffffffffffffffn;
console.log(`transformers.js ${(bytes / best / 1e6).toFixed(2).padStart(8)} MB/s  ${bytes} bytes  ${ids.length} tokens  checksum ${checksum}`);
