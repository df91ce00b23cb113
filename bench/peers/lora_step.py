#!/usr/bin/env python3
"""The peer of bench/lora_step.cpp: transformers + peft on the same model.

  lora_step.py --make DIR         write a random model with Llama 3.2 3B's
                                  config (bfloat16) to DIR
  lora_step.py --make-qwen DIR    the same with Qwen2.5 0.5B's config (a
                                  small model with a 152K vocabulary)
  lora_step.py DIR SEQ STEPS [RANK] [GEN_PROMPT GEN_NEW]
                                  LoRA r=RANK on every linear layer of the
                                  bfloat16 base (adapters float32, peft's
                                  default), gradient checkpointing on,
                                  torch AdamW, batch 1, random tokens; prints
                                  s/step (median after 2 warm-up steps),
                                  peak CUDA memory, and greedy generate's
                                  decode tokens/s.
"""
import os
import sys
import time

import torch


def make(out):
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        vocab_size=128256, hidden_size=3072, intermediate_size=8192,
        num_hidden_layers=28, num_attention_heads=24, num_key_value_heads=8,
        head_dim=128, max_position_embeddings=131072, rms_norm_eps=1e-5,
        rope_theta=500000.0, tie_word_embeddings=True, hidden_act="silu",
        rope_scaling={"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                      "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
        bos_token_id=128000, eos_token_id=128001, torch_dtype="bfloat16",
    )
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = LlamaForCausalLM(cfg).to(torch.bfloat16)
    model.save_pretrained(out, safe_serialization=True)
    print("made", out, sum(p.numel() for p in model.parameters()) / 1e9, "B parameters")


def make_qwen(out):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    cfg = Qwen2Config(
        vocab_size=151936, hidden_size=896, intermediate_size=4864,
        num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
        max_position_embeddings=32768, rms_norm_eps=1e-6, rope_theta=1000000.0,
        tie_word_embeddings=True, hidden_act="silu", bos_token_id=151643,
        eos_token_id=151643, torch_dtype="bfloat16",
    )
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = Qwen2ForCausalLM(cfg).to(torch.bfloat16)
    model.save_pretrained(out, safe_serialization=True)
    print("made", out, sum(p.numel() for p in model.parameters()) / 1e9, "B parameters")


def bench(d, seq, steps, rank, gen_prompt, gen_new):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    t0 = time.time()
    four = os.environ.get("PEER_4BIT") == "1"
    if four:  # QLoRA: bitsandbytes NF4 projections, bf16 compute, no double quant
        from transformers import BitsAndBytesConfig
        try:
            import bitsandbytes  # noqa: F401
        except ImportError:
            print("transformers+peft nf4: bitsandbytes is not installed here")
            return
        q = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4",
                               bnb_4bit_compute_dtype=torch.bfloat16,
                               bnb_4bit_use_double_quant=False)
        model = AutoModelForCausalLM.from_pretrained(d, torch_dtype=torch.bfloat16, quantization_config=q,
                                                     attn_implementation="sdpa", device_map={"": 0})
    else:
        model = AutoModelForCausalLM.from_pretrained(d, torch_dtype=torch.bfloat16,
                                                     attn_implementation="sdpa").cuda()
    torch.cuda.synchronize()
    print(f"load: {time.time() - t0:.1f} s")
    V = model.config.vocab_size
    if gen_new:  # the base model, before adapters, as orchard's bench does
        model.eval()
        prompt = torch.tensor([[(i * 7919) % V for i in range(gen_prompt)]], device="cuda")
        with torch.no_grad():
            for rep in range(2):
                torch.cuda.synchronize()
                a = time.perf_counter()
                g = model.generate(input_ids=prompt, max_new_tokens=gen_new, min_new_tokens=gen_new,
                                   do_sample=False, use_cache=True, pad_token_id=0)
                torch.cuda.synchronize()
                el = time.perf_counter() - a
        n = g.shape[1] - gen_prompt
        print(f"transformers generate: prompt {gen_prompt}, {n} new tokens: {n / el:.1f} tok/s (prefill included)")
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": True})
    model.enable_input_require_grads()
    model.config.use_cache = False
    cfg = LoraConfig(r=rank, lora_alpha=2 * rank, lora_dropout=0.0, task_type="CAUSAL_LM",
                     target_modules=["q_proj", "k_proj", "v_proj", "o_proj",
                                     "gate_proj", "up_proj", "down_proj"])
    model = get_peft_model(model, cfg)
    model.train()
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
    times = []
    torch.cuda.reset_peak_memory_stats()
    trace = os.environ.get("PEER_TRACE")
    prof = None
    for s in range(steps + 2):
        ids = torch.randint(V, (1, seq + 1), device="cuda")
        torch.cuda.synchronize()
        if trace and s == steps + 1:  # one profiled step (bench/trace_summary.py)
            prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                                      torch.profiler.ProfilerActivity.CUDA])
            prof.__enter__()
        a = time.perf_counter()
        out = model(input_ids=ids[:, :seq], labels=ids[:, :seq])  # shifted inside
        out.loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        if prof is not None:
            prof.__exit__(None, None, None)
            prof.export_chrome_trace(trace)
            prof = None
            continue  # the profiled step is not timed
        if s >= 2:
            times.append(time.perf_counter() - a)
    times.sort()
    med = times[len(times) // 2]
    peak = torch.cuda.max_memory_allocated() / 1e9
    tag = " nf4" if four else ""
    print(f"transformers+peft lora{tag} seq {seq}: {med:.3f} s/step, {seq / med:.0f} tok/s, peak {peak:.2f} GB")


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--make":
        make(sys.argv[2])
    elif len(sys.argv) == 3 and sys.argv[1] == "--make-qwen":
        make_qwen(sys.argv[2])
    elif len(sys.argv) >= 4:
        a = sys.argv
        bench(a[1], int(a[2]), int(a[3]), int(a[4]) if len(a) > 4 else 16,
              int(a[5]) if len(a) > 6 else 0, int(a[6]) if len(a) > 6 else 0)
    else:
        print(__doc__)
        sys.exit(2)
