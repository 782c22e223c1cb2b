#!/usr/bin/env python3
"""Makes tests/data/tokenizer/: a byte-level BPE tokenizer.json (vocab <= 1000, trained here with the
`tokenizers` library on a small English corpus) and a tokenizer_config.json carrying the Qwen3 chat
template of tests/chat/templates/qwen3.jinja. tests/data_train.sh puts them beside the parity Qwen3
model (vocab 1000). Run: python tests/data/make_tokenizer.py (tokenizers 0.23)."""
import json
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

HERE = Path(__file__).resolve().parent
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>"]
WORDS = ("zero one two three four five six seven eight nine ten eleven twelve the a is are what how many "
         "say number in words answer question hello world please thanks count from to and of user assistant "
         "system you I it this that with for on red green blue color name cat dog sun moon").split()
CORPUS = [" ".join(WORDS[(i * 7 + k) % len(WORDS)] for k in range(12)) for i in range(200)]
CORPUS += ["0123456789 + - * / = ( ) . , ? ! : ; ' \" \n\n", "user assistant system\n The answer is"]


def main() -> None:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=600, special_tokens=SPECIALS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(CORPUS * 3, trainer)
    assert tok.get_vocab_size() <= 1000
    out = HERE / "tokenizer"
    out.mkdir(exist_ok=True)
    tok.save(str(out / "tokenizer.json"))
    template = (HERE.parent / "chat" / "templates" / "qwen3.jinja").read_text()
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>",
        "bos_token": None, "chat_template": template}, indent=1) + "\n")


if __name__ == "__main__":
    main()
