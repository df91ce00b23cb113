"""GRPO side by side with TRL (issue 19), on the CUDA machine.

  grpo_trl.py --make 3b|0.5b DIR   a random model with Qwen2.5-3B's or
                                   0.5B's config (bf16) and a byte-level BPE
                                   tokenizer with no merges (256 byte tokens
                                   and <|endoftext|>), which transformers and
                                   Orchard both read; ids past it decode to
                                   nothing on both sides.
  grpo_trl.py --data FILE          64 prompts "What is a+b? " with answers
  grpo_trl.py DIR lora|full        TRL's GRPOTrainer on DIR: STEPS (8),
                                   G (num_generations), B
                                   (per_device_train_batch_size), ACC
                                   (gradient_accumulation_steps), C
                                   (max_completion_length) from the
                                   environment; gradient checkpointing,
                                   bf16, LoRA r=16 alpha 32 on the seven
                                   projections for `lora`. Prints one JSON
                                   line: median s/step over the steps after
                                   the first two, the share of it spent in
                                   TRL's _generate, and the CUDA allocator's
                                   peak.

Both sides score with the same cheap reward (the answer's digits appear in
the completion), and random weights run every completion to C tokens.
Run with PYTHONPATH=.peers/trl-site (../shared/peers/README.md).
"""
import json
import os
import statistics
import sys
import time

import torch


def make(size, out):
    from transformers import Qwen2Config, Qwen2ForCausalLM, PreTrainedTokenizerFast
    from tokenizers import Tokenizer, models, pre_tokenizers, decoders
    if size == "3b":
        cfg = Qwen2Config(vocab_size=151936, hidden_size=2048, intermediate_size=11008,
                          num_hidden_layers=36, num_attention_heads=16, num_key_value_heads=2,
                          max_position_embeddings=4096, tie_word_embeddings=True,
                          rms_norm_eps=1e-6, rope_theta=1000000.0, torch_dtype="bfloat16")
    else:
        cfg = Qwen2Config(vocab_size=151936, hidden_size=896, intermediate_size=4864,
                          num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
                          max_position_embeddings=4096, tie_word_embeddings=True,
                          rms_norm_eps=1e-6, rope_theta=1000000.0, torch_dtype="bfloat16")
    cfg.bos_token_id = cfg.eos_token_id = 256
    torch.manual_seed(0)
    with torch.device("cuda"):
        m = Qwen2ForCausalLM(cfg).to(torch.bfloat16)
    m.save_pretrained(out)
    # GPT-2's byte-to-character map, so the byte-level tokens are printable.
    bs = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    vocab = {chr(c): b for b, c in zip(bs, cs)}
    vocab["<|endoftext|>"] = 256
    tk = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    tk.add_special_tokens(["<|endoftext|>"])
    fast = PreTrainedTokenizerFast(tokenizer_object=tk, eos_token="<|endoftext|>",
                                   pad_token="<|endoftext|>", bos_token="<|endoftext|>")
    fast.save_pretrained(out)
    print("made", out)


def data(path):
    with open(path, "w") as f:
        for i in range(64):
            a, b = i % 7, i % 5
            f.write(json.dumps({"prompt": "What is %d+%d? " % (a, b), "answer": str(a + b)}) + "\n")


def run(model, kind):
    from datasets import Dataset
    from transformers import AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    G = int(os.environ.get("G", "8"))
    C = int(os.environ.get("C", "128"))
    steps = int(os.environ.get("STEPS", "8"))
    tok = AutoTokenizer.from_pretrained(model)
    rows = [{"prompt": "What is %d+%d? " % (i % 7, i % 5), "answer": str(i % 7 + i % 5)}
            for i in range(64)]
    ds = Dataset.from_list(rows)

    def exact_answer(completions, answer, **kw):
        return [1.0 if a in c else 0.0 for c, a in zip(completions, answer)]

    args = GRPOConfig(output_dir="/tmp/grpo-trl-out", per_device_train_batch_size=int(os.environ.get("B", G)),
                      num_generations=G, max_completion_length=C,
                      gradient_accumulation_steps=int(os.environ.get("ACC", "1")), max_steps=steps,
                      logging_steps=1, bf16=True, report_to=[], gradient_checkpointing=True,
                      learning_rate=1e-6, save_strategy="no", temperature=1.0)
    peft_config = None
    if kind == "lora":
        from peft import LoraConfig
        peft_config = LoraConfig(r=16, lora_alpha=32, task_type="CAUSAL_LM",
                                 target_modules=["q_proj", "k_proj", "v_proj", "o_proj",
                                                 "gate_proj", "up_proj", "down_proj"])
    tr = GRPOTrainer(model=model, reward_funcs=exact_answer, args=args, train_dataset=ds,
                     processing_class=tok, peft_config=peft_config)
    gen_time = [0.0]
    inner = tr._generate

    def timed(*a, **k):
        torch.cuda.synchronize()
        t = time.time()
        out = inner(*a, **k)
        torch.cuda.synchronize()
        gen_time[0] += time.time() - t
        return out
    tr._generate = timed
    marks = []

    class Clock(TrainerCallback):
        def on_step_end(self, args, state, control, **kw):
            torch.cuda.synchronize()
            marks.append((time.time(), gen_time[0]))
    tr.add_callback(Clock())
    torch.cuda.reset_peak_memory_stats()
    t0 = time.time()
    tr.train()
    times = [t0] + [m[0] for m in marks]
    gens = [0.0] + [m[1] for m in marks]
    per = [times[i + 1] - times[i] for i in range(len(marks))][2:]
    gper = [gens[i + 1] - gens[i] for i in range(len(marks))][2:]
    lengths = [h.get("completions/mean_length") for h in tr.state.log_history if "completions/mean_length" in h]
    print(json.dumps({"peer": "trl", "kind": kind, "G": G, "C": C, "steps": steps,
                      "s_per_step": statistics.median(per),
                      "generation_share": sum(gper) / sum(per),
                      "peak_gb": torch.cuda.max_memory_allocated() / 1e9,
                      "mean_completion_length": lengths[-1] if lengths else None}))


if __name__ == "__main__":
    if sys.argv[1] == "--make":
        make(sys.argv[2], sys.argv[3])
    elif sys.argv[1] == "--data":
        data(sys.argv[2])
    else:
        run(sys.argv[1], sys.argv[2])
