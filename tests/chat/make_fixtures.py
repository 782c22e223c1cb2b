"""Makes tests/chat/expected.json: every template in templates/ applied to every conversation in
conversations.json by transformers' apply_chat_template (tokenize=False), as bytes (UTF-8), or the
error it raised. Templates named *.gen.jinja carry {% generation %} tags: their expected assistant
spans (byte offsets) come from transformers' return_assistant_tokens_mask machinery
(render_jinja_template's generation indices).

Run: python tests/chat/make_fixtures.py  (needs transformers and jinja2 >= 3.1.6; no network)."""
import json, os, sys
from transformers import PreTrainedTokenizerFast
from transformers.utils.chat_template_utils import render_jinja_template

HERE = os.path.dirname(os.path.abspath(__file__))
TOK = os.path.join(HERE, "..", "tokenizer", "bytelevel", "tokenizer.json")
# bos / eos of each family's tokenizer_config.json
SPECIAL = {"qwen2.5": (None, "<|im_end|>"), "qwen3": (None, "<|im_end|>"),
           "llama3.1": ("<|begin_of_text|>", "<|eot_id|>"), "llama3.2": ("<|begin_of_text|>", "<|eot_id|>"),
           "mistral-v3": ("<s>", "</s>")}


def family(name):
    return name.replace(".gen.jinja", ".jinja").replace(".jinja", "")


def main():
    convs = json.load(open(os.path.join(HERE, "conversations.json"), encoding="utf-8"))
    names = sorted(f for f in os.listdir(os.path.join(HERE, "templates")) if f.endswith(".jinja"))
    out = []
    for name in names:
        src = open(os.path.join(HERE, "templates", name), encoding="utf-8").read()
        bos, eos = SPECIAL[family(name)]
        tok = PreTrainedTokenizerFast(tokenizer_file=TOK, bos_token=bos, eos_token=eos)
        for c in convs:
            kw = {k: v for k, v in c.items() if k not in ("name", "messages", "tools", "add_generation_prompt")}
            rec = {"template": name, "conversation": c["name"], "bos_token": bos, "eos_token": eos}
            try:
                text = tok.apply_chat_template(c["messages"], tools=c.get("tools"), chat_template=src, tokenize=False,
                                               add_generation_prompt=c["add_generation_prompt"], **kw)
                rec["rendered"] = text
                if ".gen." in name:
                    special = {k: v for k, v in (("bos_token", bos), ("eos_token", eos)) if v is not None}
                    texts, idx = render_jinja_template([c["messages"]], tools=c.get("tools"), chat_template=src,
                                                       return_assistant_tokens_mask=True,
                                                       add_generation_prompt=c["add_generation_prompt"], **special,
                                                       **kw)
                    assert texts[0] == text
                    rec["spans"] = [[len(text[:a].encode()), len(text[:b].encode())] for a, b in idx[0]]
            except Exception as e:  # the template raised (raise_exception) or failed
                rec["error"] = str(e)
            out.append(rec)
    with open(os.path.join(HERE, "expected.json"), "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print(len(out), "renderings,", sum("error" in r for r in out), "errors")


if __name__ == "__main__":
    sys.exit(main())
