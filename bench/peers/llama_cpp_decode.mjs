// llama.cpp's CPU decoding speed on a GGUF file (node-llama-cpp's prebuilt
// CPU build), the peer of `orchard generate` on the same model:
//   node llama_cpp_decode.mjs FILE.gguf PROMPT_TOKENS NEW_TOKENS THREADS
// Evaluates a prompt of PROMPT_TOKENS ids (1000, 1001, ...) in one batch,
// then NEW_TOKENS greedy tokens one at a time (llama.cpp's own sampler),
// best of 3 runs. Prints prompt and generation
// tokens/s the way `orchard generate` does. Run from a folder whose
// node_modules has node-llama-cpp (bench/run_export_bench.sh copies it into
// build/llama-judge).
import {getLlama, LlamaLogLevel} from "node-llama-cpp";

const [file, promptArg, newArg, threadsArg] = process.argv.slice(2);
const P = Number(promptArg), N = Number(newArg), threads = Number(threadsArg);
const llama = await getLlama({gpu: false, build: "never", logLevel: LlamaLogLevel.error});
const model = await llama.loadModel({modelPath: file, gpuLayers: 0});
const context = await model.createContext({
  contextSize: P + N + 8, batchSize: Math.max(P, 8), sequences: 1, threads});
const sequence = context.getSequence();
const prompt = Array.from({length: P}, (_, i) => 1000 + i);
let best = {prefill: 0, decode: 0};
for (let run = 0; run < 3; ++run) {
  await sequence.clearHistory();
  const t0 = performance.now();
  let t1 = 0, count = 0;
  // llama.cpp's own greedy sampler: the first token comes after the prompt.
  for await (const token of sequence.evaluate(prompt, {temperature: 0})) {
    if (count === 0) t1 = performance.now();
    if (++count > N) break;
  }
  const t2 = performance.now();
  const prefill = P / ((t1 - t0) / 1000), decode = N / ((t2 - t1) / 1000);
  if (decode > best.decode) best = {prefill, decode};
}
console.log(
  `llama.cpp ${file}: prompt ${P} tokens at ${best.prefill.toFixed(0)} tokens/s, ` +
  `generation ${best.decode.toFixed(2)} tokens/s (${threads} threads, best of 3)`);
await context.dispose();
await model.dispose();
await llama.dispose();
