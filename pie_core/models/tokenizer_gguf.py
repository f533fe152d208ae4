"""Build a ``tokenizers.Tokenizer`` from GGUF tokenizer metadata.

A GGUF carries no ``tokenizer.json``: it lists tokens (``tokenizer.ggml.tokens``), their kinds
(``token_type``: 1 normal, 2 unknown, 3 control, 4 user-defined, 5 unused, 6 byte), and
either merges (``gpt2``: byte-level BPE) or scores (``llama``: SentencePiece). The tokenizers
built here encode exactly as transformers' own GGUF loader does (tests compare on a varied
corpus):

* ``gpt2``: byte-level BPE, the file's merges, text split by the regex of
  ``tokenizer.ggml.pre`` (Qwen 2 and llama 3 regexes) before the byte-to-unicode mapping.
* ``llama`` on Gemma: BPE with byte fallback over the SentencePiece vocabulary, spaces
  normalised to ``▁``, no pre-splitting; runs of spaces stored as real spaces are respelled
  with ``▁``, and merges are recovered from the vocabulary in file order (Gemma files list none).
* ``llama`` elsewhere: the same with a ``▁`` prefix (Metaspace) and merges ranked by score.

Control tokens become special added tokens; user-defined ones plain added tokens (matched
whole in the text).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from tokenizers import AddedToken, Regex, decoders, normalizers, pre_tokenizers
from tokenizers import Tokenizer as HFTokenizer
from tokenizers.models import BPE

from pie_core.errors import InvalidInput, Unsupported

__all__ = ["byte_to_unicode", "build_from_gguf", "GGUFTokenizerParts", "SPLIT_REGEXES", "GPT2_SPLIT"]

CONTROL, USER_DEFINED, BYTE = 3, 4, 6

# Pre-tokenizer regexes by `tokenizer.ggml.pre` (the ones the models were trained with).
QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
GPT2_SPLIT = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
SPLIT_REGEXES = {
    "qwen2": QWEN2_SPLIT,
    "deepseek-r1-qwen": QWEN2_SPLIT,
    "llama3": LLAMA3_SPLIT,
    "llama-v3": LLAMA3_SPLIT,
    "llama-bpe": LLAMA3_SPLIT,
    "smaug-bpe": LLAMA3_SPLIT,
    "dbrx": LLAMA3_SPLIT,
}


def byte_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte → printable character map used by byte-level BPE vocabularies.

    Printable Latin-1 bytes stand for themselves; the other 68 bytes are shifted to the code
    points from U+0100 upwards, in byte order.
    """
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table = {b: chr(b) for b in printable}
    shifted = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + shifted)
            shifted += 1
    return table


@dataclass(frozen=True, slots=True)
class GGUFTokenizerParts:
    """A built tokenizer and the facts about it that ``tokenizers`` does not keep.

    Attributes:
        tokenizer: The ``tokenizers`` object.
        kind: ``"byte_level"`` or ``"sentencepiece"`` (decides how token text maps to bytes).
        tokens: Token strings by id, as the tokenizer spells them.
        token_types: GGUF token type by id.
        split_regex: Pre-tokenization regex (empty for SentencePiece).
    """

    tokenizer: HFTokenizer
    kind: str
    tokens: list[str]
    token_types: list[int]
    split_regex: str


def recover_merges(vocab: dict[str, int], rank: dict[str, float]) -> list[tuple[str, str]]:
    """Merges implied by a vocabulary: every split of a token into two tokens.

    Ordered best first by the merged token's ``rank`` (higher first), then by longer left
    piece, then longer right piece; ties keep vocabulary order, splits of one token ordered
    by the ids of their pieces. This is the order transformers uses for SentencePiece files.
    """
    found: list[tuple[str, str, float]] = []
    for token, score in rank.items():
        local = [
            (token[:i], token[i:], score) for i in range(1, len(token)) if token[:i] in vocab and token[i:] in vocab
        ]
        local.sort(key=lambda m: (vocab[m[0]], vocab[m[1]]))
        found.extend(local)
    found.sort(key=lambda m: (m[2], len(m[0]), len(m[1])), reverse=True)
    return [(left, right) for left, right, _ in found]


def _pair(merge: str) -> tuple[str, str]:
    left, _, right = merge.partition(" ")
    return left, right


def _byte_level(tokens: list[str], merges: Sequence[str], pre: str) -> tuple[HFTokenizer, list[str], str]:
    spelling = byte_to_unicode()
    alphabet = set(spelling.values())
    spelled = [t if set(t) <= alphabet else "".join(spelling[b] for b in t.encode("utf-8")) for t in tokens]
    vocab = {t: i for i, t in enumerate(spelled)}
    pairs = [_pair(m) for m in merges]
    model = BPE(vocab=vocab, merges=pairs, dropout=None, continuing_subword_prefix="", end_of_word_suffix="", fuse_unk=False)
    tok = HFTokenizer(model)
    regex = SPLIT_REGEXES.get(pre)
    if regex is None:
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
        regex = GPT2_SPLIT
    else:
        tok.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.Split(Regex(regex), behavior="isolated"), pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]
        )
    tok.decoder = decoders.ByteLevel()
    return tok, spelled, regex


def _sentencepiece(tokens: list[str], scores: Any, gemma: bool, add_space_prefix: bool) -> tuple[HFTokenizer, list[str]]:
    if gemma:
        spelled = ["▁" * len(t) if " " in t and not t.strip() else t for t in tokens]
        rank: dict[str, float] = {t: -i for i, t in enumerate(spelled)}
    else:
        spelled = list(tokens)
        if scores is None:
            raise Unsupported("a SentencePiece GGUF tokenizer needs tokenizer.ggml.scores")
        rank = {t: float(s) for t, s in zip(spelled, scores)}
    vocab = {t: i for i, t in enumerate(spelled)}
    unk = next((t for t in ("<unk>",) if t in vocab), None)
    tok = HFTokenizer(BPE(vocab=vocab, merges=recover_merges(vocab, rank), fuse_unk=True, unk_token=unk, dropout=None, byte_fallback=True))
    steps = [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()]
    if gemma:
        tok.normalizer = normalizers.Replace(" ", "▁")
        tok.pre_tokenizer = pre_tokenizers.Split(pattern=" ", behavior="merged_with_previous", invert=False)
    else:
        scheme = "first" if add_space_prefix else "never"
        tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme=scheme, split=False)
        if add_space_prefix:
            steps.append(decoders.Strip(content=" ", left=1))
    tok.decoder = decoders.Sequence(steps)
    return tok, spelled


def build_from_gguf(metadata: dict[str, Any], arch: str) -> GGUFTokenizerParts:
    """Build the tokenizer a GGUF describes.

    Args:
        metadata: The file's metadata (see :class:`pie_core.models.gguf_file.GGUFFile`).
        arch: ``general.architecture``.

    Returns:
        The tokenizer and its per-token facts.

    Raises:
        Unsupported: A ``tokenizer.ggml.model`` other than ``gpt2`` or ``llama``.
        InvalidInput: The file has no tokenizer.
    """
    model = str(metadata.get("tokenizer.ggml.model", ""))
    if "tokenizer.ggml.tokens" not in metadata:
        raise InvalidInput("this GGUF has no tokenizer (no tokenizer.ggml.tokens); it cannot be served")
    tokens: list[str] = list(metadata["tokenizer.ggml.tokens"])
    raw_types = metadata.get("tokenizer.ggml.token_type")
    types = [int(t) for t in raw_types] if raw_types is not None else [1] * len(tokens)
    if model == "gpt2":
        merges = metadata.get("tokenizer.ggml.merges") or []
        tok, spelled, regex = _byte_level(tokens, merges, str(metadata.get("tokenizer.ggml.pre", "")))
        kind = "byte_level"
        alphabet = set(byte_to_unicode().values())
        # A control token outside the byte alphabet is a converter mislabel; adding it would
        # grow the vocabulary past the embedding.
        control = [t for t, k in zip(tokens, types) if k == CONTROL and set(t) <= alphabet]
    elif model == "llama":
        gemma = arch.startswith("gemma")
        tok, spelled = _sentencepiece(tokens, metadata.get("tokenizer.ggml.scores"), gemma, bool(metadata.get("tokenizer.ggml.add_space_prefix", True)))
        kind, regex = "sentencepiece", ""
        control = [t for t, k in zip(tokens, types) if k == CONTROL]
    else:
        raise Unsupported(f"GGUF tokenizer model {model!r} is not supported; supported: gpt2, llama")
    if control:
        tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in control])
    vocab = tok.get_vocab(with_added_tokens=False)
    user = [t for t, k in zip(tokens, types) if k == USER_DEFINED and t in vocab]
    if user:
        tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in user])
    return GGUFTokenizerParts(tok, kind, spelled, types, regex)
