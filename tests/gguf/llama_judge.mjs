// The judge of `orchard export gguf`: llama.cpp itself (node-llama-cpp's
// prebuilt CPU build) loads each file and reports, for the test to compare
// with Orchard (tests/e2e/export_test.cpp):
//   logits   teacher-forced: the next-token logits after every prefix of
//            each id sequence
//   greedy   llama.cpp's greedy continuation of each prompt (ids)
//   tokens   llama.cpp's tokenisation of each text (no BOS, no specials)
//   values   the metadata values of `metadata_keys`, as the independent
//            GGUF reader (@huggingface/gguf) reads them
//   prompt   the chat template read back by an independent GGUF reader
//            (@huggingface/gguf) and rendered by @huggingface/jinja, the
//            engine node-llama-cpp applies templates with, and its tokens
//            as llama.cpp reads them (special tokens recognised)
// Usage: node llama_judge.mjs REQUEST.json RESULT.json
// REQUEST: {"models": [{"path", "sequences": [[ids]], "prompts": [[ids]],
//           "new_tokens", "texts": [str], "messages": [{role, content}],
//           "metadata_keys": [str]}]}
import fs from "node:fs";
import {getLlama, LlamaLogLevel} from "node-llama-cpp";
import {gguf} from "@huggingface/gguf";
import {Template} from "@huggingface/jinja";

const request = JSON.parse(fs.readFileSync(process.argv[2], "utf8"));
const llama = await getLlama({gpu: false, build: "never", logLevel: LlamaLogLevel.error});

function dense(map) {
  const out = new Array(map.size).fill(0);
  for (const [id, v] of map) out[id] = v;
  return out;
}

const results = [];
for (const m of request.models) {
  const r = {path: m.path};
  try {
    const model = await llama.loadModel({modelPath: m.path, gpuLayers: 0});
    const context = await model.createContext({contextSize: 512, batchSize: 512, sequences: 1});
    const sequence = context.getSequence();
    r.logits = [];
    for (const ids of m.sequences ?? []) {
      await sequence.clearHistory();
      const out = await sequence.controlledEvaluate(
        ids.map((t) => [t, {generateNext: {logits: true}}]));
      r.logits.push(out.map((o) => dense(o.next.logits)));
    }
    r.greedy = [];
    for (const prompt of m.prompts ?? []) {
      await sequence.clearHistory();
      const got = [];
      let input = prompt.map((t, i) =>
        i + 1 === prompt.length ? [t, {generateNext: {logits: true}}] : t);
      for (let k = 0; k < (m.new_tokens ?? 8); ++k) {
        const out = await sequence.controlledEvaluate(input);
        const logits = out[out.length - 1].next.logits;
        const next = logits.entries().next().value[0]; // sorted, highest first
        got.push(next);
        input = [[next, {generateNext: {logits: true}}]];
      }
      r.greedy.push(got);
    }
    r.tokens = (m.texts ?? []).map((t) => Array.from(model.tokenize(t, false)));
    const {metadata} = m.messages || m.metadata_keys
      ? await gguf(m.path, {allowLocalFile: true})
      : {metadata: null};
    if (m.metadata_keys) {
      r.values = {};
      for (const k of m.metadata_keys) r.values[k] = metadata[k] ?? null;
    }
    if (m.messages) {
      const tmpl = metadata["tokenizer.chat_template"];
      const id = (k) => metadata[k];
      const text = (k) => id(k) === undefined ? "" : metadata["tokenizer.ggml.tokens"][id(k)];
      r.prompt = tmpl === undefined ? null : new Template(tmpl).render({
        messages: m.messages,
        add_generation_prompt: true,
        bos_token: text("tokenizer.ggml.bos_token_id"),
        eos_token: text("tokenizer.ggml.eos_token_id"),
      });
      r.prompt_tokens = r.prompt === null ? null : Array.from(model.tokenize(r.prompt, true));
      r.metadata = {
        architecture: metadata["general.architecture"],
        file_type: metadata["general.file_type"],
        tokenizer_model: metadata["tokenizer.ggml.model"],
        pre: metadata["tokenizer.ggml.pre"],
        add_bos: metadata["tokenizer.ggml.add_bos_token"],
      };
    }
    await context.dispose();
    await model.dispose();
  } catch (e) {
    r.error = String(e?.message ?? e);
  }
  results.push(r);
}
fs.writeFileSync(process.argv[3], JSON.stringify({models: results}));
await llama.dispose();
