"""Text for language models: tokenizers (tokenizer.py) and the tokenizer a run keeps (run_tokenizer.py)."""

from gputrain.text.tokenizer import Tokenizer, load_tokenizer, train_bpe

__all__ = ["Tokenizer", "load_tokenizer", "train_bpe"]
