#!/usr/bin/env python3
"""Golden fixtures for Orchard's Hugging Face model loading and LoRA, made
with transformers and peft (run on the CUDA machine, not in CI):

  make_hf_fixtures.py OUT_DIR
      writes OUT_DIR/{llama,qwen2,mistral}/ : tiny random models saved by
      transformers (qwen2 sharded, so the index path is exercised), each
      with reference.safetensors: input_ids, logits in float32 and bfloat16,
      the loss and the gradients of a few parameters; llama and qwen2 also
      get a small byte-level BPE tokenizer and a chat template.
      OUT_DIR/llama_lora/ : an adapter saved by peft (random A and B) and
      reference.safetensors with the adapted logits, the loss, the LoRA
      gradients and the logits of the merged model.

  make_hf_fixtures.py --mistral-sp OUT_DIR
      writes OUT_DIR/mistral_sp/ : a tiny MistralForCausalLM with
      sliding_window 8 (the references use 24 tokens, so the window cuts
      in) and a SentencePiece-style tokenizer.json as Llama 2 and Mistral
      v0.1 ship it ("▁" for spaces, <0xXX> byte fallback, the legacy
      Prepend/Replace normalizer) with a Mistral chat template; its
      reference.safetensors is as above and chat_reference.json holds a
      conversation and transformers' apply_chat_template ids.

  make_hf_fixtures.py --verify-adapter MODEL ADAPTER LOGITS
      loads ADAPTER (written by Orchard) onto MODEL with peft and checks the
      logits against LOGITS (Orchard's, a safetensors with input_ids and
      logits); exit 1 on a difference.
  make_hf_fixtures.py --verify-merged MERGED LOGITS
      loads MERGED (Orchard's `lora merge` output) with transformers and
      checks the logits the same way.

The test that reads these is tests/golden/hf_model_test.cpp.
"""
import json
import os
import sys

import torch
from safetensors.torch import load_file, save_file

TEXT = (
    "the quick brown fox jumps over the lazy dog. a word is a unit of "
    "language; a noun names a thing, a verb names an action. what is a "
    "river? a large natural stream of water. what is a mountain? a land "
    "mass that projects well above its surroundings. hello, how are you? "
    "i am fine, thank you. the answer is yes. the answer is no. "
) * 20

LLAMA3_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'"
    " + message['content'] | trim + '<|eot_id|>' }}{% endfor %}"
    "{% if add_generation_prompt %}"
    "{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}"
)
CHATML_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + "
    "'\\n' + message['content'] + '<|im_end|>' + '\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def make_tokenizer(out_dir, specials, template, bos, eos):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=320,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator([TEXT], trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token=bos, eos_token=eos, chat_template=template
    )
    fast.save_pretrained(out_dir)
    return fast, tok.get_vocab_size()


MISTRAL_TEMPLATE = (
    "{{ bos_token }}{% set ns = namespace(system='') %}"
    "{% for message in messages %}"
    "{% if message['role'] == 'system' %}"
    "{% set ns.system = ns.system + message['content'] + '\\n\\n' %}"
    "{% elif message['role'] == 'user' %}"
    "{{ '[INST] ' + ns.system + message['content'] + ' [/INST]' }}"
    "{% set ns.system = '' %}"
    "{% else %}{{ message['content'] + eos_token }}{% endif %}{% endfor %}"
)


def chat_ids(fast, conv):
    ids = fast.apply_chat_template(conv, tokenize=True)
    # transformers 5 returns a BatchEncoding, 4.x a list
    return ids if isinstance(ids, list) else ids["input_ids"]


def make_sp_tokenizer(out_dir):
    """A small tokenizer.json in Llama 2's SentencePiece style: <unk> <s> </s>,
    the 256 <0xXX> byte tokens, then merges learnt on words that start with
    "▁"; the legacy normalizer and no pre-tokenizer, as Llama 2's file."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    meta = "\u2581"
    tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tok.normalizer = normalizers.Sequence(
        [normalizers.Prepend(meta), normalizers.Replace(" ", meta)])
    # Words for learning only: merges never cross a word start.
    tok.pre_tokenizer = pre_tokenizers.Metaspace(
        replacement=meta, prepend_scheme="never", split=True)
    specials = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=specials,
                                  show_progress=False)
    tok.train_from_iterator([TEXT], trainer)
    j = json.loads(tok.to_str())
    # As in Llama 2's file: the byte tokens live only in the vocabulary.
    j["added_tokens"] = [a for a in j["added_tokens"] if not a["content"].startswith("<0x")]
    j["pre_tokenizer"] = None
    j["decoder"] = {"type": "Sequence", "decoders": [
        {"type": "Replace", "pattern": {"String": meta}, "content": " "},
        {"type": "ByteFallback"}, {"type": "Fuse"},
        {"type": "Strip", "content": " ", "start": 1, "stop": 0}]}
    j["post_processor"] = {
        "type": "TemplateProcessing",
        "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}},
                   {"Sequence": {"id": "A", "type_id": 0}}],
        "pair": [{"SpecialToken": {"id": "<s>", "type_id": 0}},
                 {"Sequence": {"id": "A", "type_id": 0}},
                 {"SpecialToken": {"id": "<s>", "type_id": 1}},
                 {"Sequence": {"id": "B", "type_id": 1}}],
        "special_tokens": {"<s>": {"id": "<s>", "ids": [1], "tokens": ["<s>"]}}}
    tok = Tokenizer.from_str(json.dumps(j))
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>",
        chat_template=MISTRAL_TEMPLATE)
    fast.save_pretrained(out_dir)
    return fast, tok.get_vocab_size()


def make_mistral_sp(out):
    d = os.path.join(out, "mistral_sp")
    os.makedirs(d, exist_ok=True)
    fast, vocab = make_sp_tokenizer(d)
    from transformers import MistralConfig, MistralForCausalLM

    torch.manual_seed(4)
    cfg = MistralConfig(
        vocab_size=vocab, hidden_size=64, intermediate_size=96,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        max_position_embeddings=256, torch_dtype="float32", rms_norm_eps=1e-5,
        rope_theta=10000.0, tie_word_embeddings=False, sliding_window=8,
        bos_token_id=1, eos_token_id=2)
    model = MistralForCausalLM(cfg)
    randomize(model, 4)
    model.eval()
    model.save_pretrained(d, safe_serialization=True)
    ids = torch.randint(0, vocab, (2, 24), generator=torch.Generator().manual_seed(4))
    grads = ["model.embed_tokens.weight", "model.layers.0.self_attn.q_proj.weight",
             "model.layers.1.mlp.down_proj.weight", "model.norm.weight", "lm_head.weight"]
    ref = references(model, ids, grads)
    ref["logits_bf16"] = bf16_logits(model, ids)
    # A window that does not cut in gives different logits: the fixture
    # really tests the window.
    full = MistralForCausalLM(MistralConfig(**{**cfg.to_dict(), "sliding_window": None}))
    full.load_state_dict(model.state_dict())
    with torch.no_grad():
        gap = (full.eval()(ids).logits - ref["logits_fp32"]).abs().max().item()
    assert gap > 1e-3, gap
    conv = [{"role": "system", "content": "be brief"},
            {"role": "user", "content": "what is a river? (asked in Z\u00fcrich)"},
            {"role": "assistant", "content": "a large natural stream of water."},
            {"role": "user", "content": "and a mountain?"},
            {"role": "assistant", "content": "a land mass  well above its surroundings."}]
    text_ids = chat_ids(fast, conv)
    ref["chat_ids"] = torch.tensor(text_ids, dtype=torch.int64)
    prompt_ids = chat_ids(fast, conv[:2])
    text = "the answer is yes. Zebra \u00e9t\u00e9 \U0001F600"
    with open(os.path.join(d, "chat_reference.json"), "w") as f:
        json.dump({"messages": conv, "ids": text_ids, "prompt_ids": prompt_ids,
                   "text": text, "text_ids": fast(text)["input_ids"]}, f)
    save_file(ref, os.path.join(d, "reference.safetensors"))
    print("mistral_sp vocab", vocab, "loss", float(ref["loss"]), "window gap", gap)


def references(model, ids, grad_names):
    out = {"input_ids": ids}
    model.zero_grad()
    logits = model(ids).logits
    out["logits_fp32"] = logits.detach().float().contiguous()
    loss = torch.nn.functional.cross_entropy(
        logits[:, :-1].reshape(-1, logits.size(-1)).float(), ids[:, 1:].reshape(-1)
    )
    loss.backward()
    out["loss"] = loss.detach().reshape(1)
    params = dict(model.named_parameters())
    for n in grad_names:
        out["grad." + n] = params[n].grad.detach().float().contiguous()
    model.zero_grad()
    return out


def bf16_logits(model, ids):
    import copy

    m = copy.deepcopy(model).to(torch.bfloat16)
    with torch.no_grad():
        return m(ids).logits.float().contiguous()


def tiny(arch, vocab):
    from transformers import (
        LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM,
        Qwen2Config, Qwen2ForCausalLM,
    )
    common = dict(
        vocab_size=vocab, hidden_size=64, intermediate_size=96,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        max_position_embeddings=256, torch_dtype="float32",
    )
    if arch == "llama":
        cfg = LlamaConfig(
            **common, rms_norm_eps=1e-5, rope_theta=500000.0,
            tie_word_embeddings=True, bos_token_id=None, eos_token_id=None,
            rope_scaling={"rope_type": "llama3", "factor": 8.0,
                          "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                          "original_max_position_embeddings": 64},
        )
        return LlamaForCausalLM(cfg)
    if arch == "qwen2":
        cfg = Qwen2Config(**common, rms_norm_eps=1e-6, rope_theta=1000000.0,
                          tie_word_embeddings=False)
        return Qwen2ForCausalLM(cfg)
    cfg = MistralConfig(**common, rms_norm_eps=1e-5, rope_theta=10000.0,
                        tie_word_embeddings=False, sliding_window=None)
    return MistralForCausalLM(cfg)


def randomize(model, seed):
    # Transformers' init leaves norms at 1 and biases at 0; random values
    # make the test see whether each is applied.
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "norm" in n:
                p.copy_(1 + 0.2 * torch.randn(p.shape, generator=g))
            elif n.endswith("bias"):
                p.copy_(0.1 * torch.randn(p.shape, generator=g))


def make(out):
    torch.manual_seed(0)
    os.makedirs(out, exist_ok=True)
    for arch, seed in (("llama", 1), ("qwen2", 2), ("mistral", 3)):
        d = os.path.join(out, arch)
        os.makedirs(d, exist_ok=True)
        vocab = 320
        if arch == "llama":
            fast, vocab = make_tokenizer(
                d, ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>",
                    "<|end_header_id|>", "<|eot_id|>"], LLAMA3_TEMPLATE,
                "<|begin_of_text|>", "<|eot_id|>")
        elif arch == "qwen2":
            fast, vocab = make_tokenizer(
                d, ["<|endoftext|>", "<|im_start|>", "<|im_end|>"], CHATML_TEMPLATE,
                None, "<|im_end|>")
        torch.manual_seed(seed)
        model = tiny(arch, vocab)
        randomize(model, seed)
        model.eval()
        shard = "40KB" if arch == "qwen2" else "5GB"
        model.save_pretrained(d, safe_serialization=True, max_shard_size=shard)
        ids = torch.randint(0, vocab, (2, 24), generator=torch.Generator().manual_seed(seed))
        grads = ["model.embed_tokens.weight", "model.layers.0.self_attn.q_proj.weight",
                 "model.layers.1.mlp.down_proj.weight", "model.norm.weight",
                 "model.layers.0.input_layernorm.weight"]
        if arch == "qwen2":
            grads += ["model.layers.1.self_attn.k_proj.bias", "lm_head.weight"]
        ref = references(model, ids, grads)
        ref["logits_bf16"] = bf16_logits(model, ids)
        if arch in ("llama", "qwen2"):
            conv = [{"role": "system", "content": "be brief"},
                    {"role": "user", "content": "what is a river?"},
                    {"role": "assistant", "content": "a large natural stream of water."}]
            text_ids = chat_ids(fast, conv)
            ref["chat_ids"] = torch.tensor(text_ids, dtype=torch.int64)
            with open(os.path.join(d, "chat_reference.json"), "w") as f:
                json.dump({"messages": conv, "ids": text_ids}, f)
        save_file(ref, os.path.join(d, "reference.safetensors"))
        if arch == "llama":
            make_lora(model, ids, os.path.join(out, "llama_lora"))
        print(arch, "vocab", vocab, "loss", float(ref["loss"]))


def make_lora(model, ids, d):
    import copy

    from peft import LoraConfig, get_peft_model

    base = copy.deepcopy(model)
    cfg = LoraConfig(
        r=4, lora_alpha=8, lora_dropout=0.0, init_lora_weights=False,
        target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj",
                        "up_proj", "down_proj"], task_type="CAUSAL_LM",
    )
    torch.manual_seed(7)
    pm = get_peft_model(base, cfg)
    pm.save_pretrained(d)
    os.remove(os.path.join(d, "README.md"))  # peft's empty model card
    names = [n for n, p in pm.named_parameters() if p.requires_grad]
    pick = [n for n in names if "layers.0.self_attn.q_proj" in n or "layers.1.mlp.down_proj" in n]
    logits = pm(ids).logits
    loss = torch.nn.functional.cross_entropy(
        logits[:, :-1].reshape(-1, logits.size(-1)), ids[:, 1:].reshape(-1))
    loss.backward()
    params = dict(pm.named_parameters())
    ref = {"input_ids": ids, "logits_fp32": logits.detach().contiguous(),
           "loss": loss.detach().reshape(1)}
    for n in pick:
        # peft's live names carry the adapter name: ...lora_A.default.weight
        ref["grad." + n.replace(".default", "")] = params[n].grad.detach().contiguous()
    with torch.no_grad():
        merged = pm.merge_and_unload()
        ref["merged_logits_fp32"] = merged(ids).logits.contiguous()
    save_file(ref, os.path.join(d, "reference.safetensors"))


def verify(model_logits, want_file, what):
    want = load_file(want_file)
    got = model_logits(want["input_ids"])
    diff = (got.float() - want["logits"].float()).abs().max().item()
    print(f"{what}: max |logits difference| = {diff:.3g}")
    if diff > 1e-4 * max(1.0, want["logits"].abs().max().item()):
        print(f"{what}: FAILED")
        sys.exit(1)


def main():
    if len(sys.argv) == 5 and sys.argv[1] == "--verify-adapter":
        from peft import PeftModel
        from transformers import AutoModelForCausalLM

        base = AutoModelForCausalLM.from_pretrained(sys.argv[2], torch_dtype=torch.float32)
        pm = PeftModel.from_pretrained(base, sys.argv[3]).eval()
        with torch.no_grad():
            verify(lambda ids: pm(ids).logits, sys.argv[4], "peft loads Orchard's adapter")
    elif len(sys.argv) == 4 and sys.argv[1] == "--verify-merged":
        from transformers import AutoModelForCausalLM

        m = AutoModelForCausalLM.from_pretrained(sys.argv[2], torch_dtype=torch.float32).eval()
        with torch.no_grad():
            verify(lambda ids: m(ids).logits, sys.argv[3], "transformers loads Orchard's merge")
    elif len(sys.argv) == 3 and sys.argv[1] == "--mistral-sp":
        make_mistral_sp(sys.argv[2])
    elif len(sys.argv) == 2:
        make(sys.argv[1])
    else:
        print(__doc__)
        sys.exit(2)


if __name__ == "__main__":
    main()
