"""A byte-level tokenizer for Hugging Face models: token id = byte value.

GPT-2's byte-to-character map with a BPE model of no merges, so every byte of
the UTF-8 text is one token and ``decode(encode(text)) == text``. The models of
``evolve.data.sources.neural_pair`` use it, saved beside them with
``save_pretrained`` so that ``AutoTokenizer`` loads it from the model directory.
"""

from __future__ import annotations

VOCAB = 256


def bytes_to_unicode() -> dict:
    """GPT-2's reversible map of the 256 bytes onto printable characters."""
    bs = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("\u00a1"), ord("\u00ac") + 1))
          + list(range(ord("\u00ae"), ord("\u00ff") + 1)))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


def byte_tokenizer(ids: dict | None = None):
    """A ``PreTrainedTokenizerFast`` mapping byte b to id ``ids[b]`` (default: b)."""
    # lazy: start-up (tokenizers loads only where it is used)
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    # lazy: start-up (transformers loads only where it is used)
    from transformers import PreTrainedTokenizerFast
    chars = bytes_to_unicode()
    ids = ids or {b: b for b in range(VOCAB)}
    vocab = {chars[b]: int(ids[b]) for b in range(VOCAB)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=tok)
