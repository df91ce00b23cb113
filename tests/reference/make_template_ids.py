"""transformers' apply_chat_template ids for real chat templates on the
fixture tokenizers (tests/golden/chat_template_test.cpp checks Orchard's ids
against them). Run on the CUDA machine, from the repository root:
    python3 tests/reference/make_template_ids.py

Every template in tests/fixtures/chat_templates/ is paired with the fixture
tokenizer of its family (Llama 3.x: hf/llama, ChatML: hf/qwen2, [INST]
templates: hf/mistral_sp) and rendered over reference.json's conversations,
with and without the generation prompt; date_string is fixed so the Llama
3.2 template does not print today's date. Conversations a template refuses
are left out.
"""
import json
import os

import transformers
from transformers import AutoTokenizer

ROOT = os.path.join("tests", "fixtures")
PAIRS = {
    "llama-3.2.jinja": "llama",
    "qwen2.5.jinja": "qwen2",
    "mistral-v0.1.jinja": "mistral_sp",
    "mistral-v0.3.jinja": "mistral_sp",
    "mistral-nemo.jinja": "mistral_sp",
    "llama-2-chat.jinja": "mistral_sp",
}


def main():
    ref = json.load(open(os.path.join(ROOT, "chat_templates", "reference.json")))
    cases = []
    for name, tok_name in PAIRS.items():
        tok = AutoTokenizer.from_pretrained(os.path.join(ROOT, "hf", tok_name))
        source = open(os.path.join(ROOT, "chat_templates", name)).read()
        for c, conv in enumerate(ref["conversations"]):
            for gen in (False, True):
                try:
                    ids = tok.apply_chat_template(
                        conv, chat_template=source, tokenize=True,
                        add_generation_prompt=gen, date_string="26 Jul 2024")
                except Exception:  # the template refuses it
                    continue
                if hasattr(ids, "keys"):  # transformers 5: a BatchEncoding
                    ids = ids["input_ids"]
                cases.append({"template": name, "tokenizer": tok_name,
                              "conversation": c, "add_generation_prompt": gen,
                              "ids": list(ids)})
    out = {"about": "tests/reference/make_template_ids.py, transformers " +
                    transformers.__version__,
           "cases": cases}
    path = os.path.join(os.environ.get("OUT", "."), "token_reference.json")
    with open(path, "w") as f:
        json.dump(out, f, indent=0)
    print(len(cases), "cases ->", path)


if __name__ == "__main__":
    main()
