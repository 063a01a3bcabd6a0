"""A character tokenizer for benchmarks whose random models' answers must come back as the same
token ids when a client re-sends their text (as a trained model's answers do): every token is one
character, with no merges, normaliser or pre-tokenizer, and the `Fuse` decoder concatenates them,
so any sequence of ids decodes to a text that encodes to those ids again. The vocabulary: the
demo tokenizer's three specials (`<unk>`, `<s>`, `</s>`), tab, newline, printable ASCII (for
prompts and chat templates), then CJK ideographs up to SIZE tokens. The chat template and special
tokens are the demo model's (models/gdn-demo).

    python3 benches/char_tokenizer.py OUT_DIR [SIZE=4096]
"""
import json
import os
import shutil
import sys


def main(out, size=4096):
    os.makedirs(out, exist_ok=True)
    specials = ["<unk>", "<s>", "</s>"]
    chars = ["\t", "\n"] + [chr(c) for c in range(32, 127)]
    chars += [chr(0x4E00 + i) for i in range(size - len(specials) - len(chars))]
    vocab = {t: i for i, t in enumerate(specials + chars)}
    added = [
        {"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False, "normalized": False, "special": True}
        for i, t in enumerate(specials)
    ]
    tok = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": None,
        "pre_tokenizer": None,
        "post_processor": {
            "type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
            "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 0}}],
            "special_tokens": {"<s>": {"id": "<s>", "ids": [1], "tokens": ["<s>"]}},
        },
        "decoder": {"type": "Fuse"},
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": "<unk>",
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": False,
            "byte_fallback": False,
            "ignore_merges": False,
            "vocab": vocab,
            "merges": [],
        },
    }
    with open(os.path.join(out, "tokenizer.json"), "w") as f:
        json.dump(tok, f, ensure_ascii=False)
    demo = os.path.join(os.path.dirname(__file__), "..", "models", "gdn-demo")
    for name in ["tokenizer_config.json", "generation_config.json"]:
        shutil.copy(os.path.join(demo, name), os.path.join(out, name))
    print(f"{out}: {len(vocab)} tokens, one character each")


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 4096)
