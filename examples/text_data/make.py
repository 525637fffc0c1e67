"""Writes examples/text_data (run from the repository root): sft.jsonl (sums as prompt/response records and chat
conversations), reviews.csv (two sentiments) and a 512-token byte-level BPE tokenizer trained on them, with a
ChatML chat template in tokenizer_config.json. Deterministic: the same files every run."""

import json
import random
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

out = Path("examples/text_data")
rng = random.Random(0)
sft = []
for _ in range(400):
    a, b = rng.randint(0, 20), rng.randint(0, 20)
    if rng.random() < 0.5:
        sft.append({"prompt": f"Question: what is {a} plus {b}?\nAnswer:", "response": f" {a + b}"})
    else:
        sft.append(
            {
                "messages": [
                    {"role": "user", "content": f"What is {a} plus {b}?"},
                    {"role": "assistant", "content": f"{a} plus {b} is {a + b}."},
                ]
            }
        )
good = [
    "a wonderful film",
    "great acting and a great plot",
    "I loved every minute",
    "beautiful and moving",
    "a delight from start to end",
    "funny, warm and clever",
]
bad = [
    "a boring mess",
    "terrible acting",
    "I want my money back",
    "dull and far too long",
    "the plot makes no sense",
    "a waste of an evening",
]
rows = ["review,sentiment"]
for _ in range(300):
    pos = rng.random() < 0.5
    rows.append(f'"{rng.choice(good if pos else bad)}",{"positive" if pos else "negative"}')
corpus = [json.dumps(r) for r in sft] + rows + good + bad
tok = Tokenizer(models.BPE())
tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
tok.decoder = decoders.ByteLevel()
trainer = trainers.BpeTrainer(
    vocab_size=512,
    special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
    initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    show_progress=False,
)
tok.train_from_iterator(corpus, trainer=trainer)
out.mkdir(parents=True, exist_ok=True)
tok.save(str(out / "tokenizer.json"))
chatml = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
(out / "tokenizer_config.json").write_text(
    json.dumps({"eos_token": "<|endoftext|>", "chat_template": chatml}, indent=1) + "\n"
)
(out / "sft.jsonl").write_text("".join(json.dumps(r) + "\n" for r in sft))
(out / "reviews.csv").write_text("\n".join(rows) + "\n")
