"""The vocabulary as xgrammar sees it, built from the engine's own tokenizer.

xgrammar needs, for every token id the model can emit, the bytes that token adds to the output.
:meth:`pie_core.models.tokenizer.Tokenizer.token_bytes` already gives exactly that (byte-level
and SentencePiece spellings decoded), so the vocabulary is handed over as ``VocabType.RAW``.

- Special (control) tokens get an empty spelling: xgrammar treats such tokens as special and
  never allows them, except the stop tokens.
- Ids past the tokenizer's vocabulary (embedding rows added for padding) have no spelling and
  are masked the same way; the mask covers the model's full ``vocab_size``.
- Stop tokens (the chat format's end-of-turn tokens and the tokenizer's EOS ids) are allowed
  exactly when the grammar can end.
"""

from __future__ import annotations

from typing import Iterable

from pie_core.grammar.lazy_xgr import xgr

from pie_core.errors import InvalidInput
from pie_core.models.tokenizer import Tokenizer

__all__ = ["tokenizer_info"]


def tokenizer_info(tokenizer: Tokenizer, vocab_size: int, stop_ids: Iterable[int]) -> xgr.TokenizerInfo:
    """Build xgrammar's ``TokenizerInfo`` for a model.

    Args:
        tokenizer: The model's tokenizer.
        vocab_size: Rows of the model's output layer (the mask width); ids beyond the
            tokenizer's vocabulary are masked.
        stop_ids: Tokens that end a generation; allowed when the grammar can end.

    Raises:
        InvalidInput: No stop token, or a stop token outside the vocabulary.
    """
    stops = sorted(set(int(s) for s in stop_ids))
    if not stops:
        raise InvalidInput("a grammar needs at least one stop token to end on; the model has none")
    bad = [s for s in stops if not 0 <= s < vocab_size]
    if bad:
        raise InvalidInput(f"stop token {bad[0]} is outside the vocabulary of {vocab_size}")
    _, table = tokenizer.vocabs()
    special = tokenizer.special_ids
    encoded = [b"" if i in special else piece for i, piece in enumerate(table[:vocab_size])]
    return xgr.TokenizerInfo(encoded, xgr.VocabType.RAW, vocab_size=vocab_size, stop_token_ids=stops)
