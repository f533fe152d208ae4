"""The engine's tokenizer: a ``tokenizers.Tokenizer`` plus the byte-level facts serving needs.

Encoding recognises special tokens written in the text and never adds BOS (chat formats add
what their template adds). :meth:`Tokenizer.token_bytes` gives the exact bytes each token
contributes to the output, so a stream can be decoded incrementally without splitting a UTF-8
character.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer as HFTokenizer

from pie_core.errors import NotFound
from pie_core.models.gguf_file import GGUFFile
from pie_core.models.tokenizer_gguf import BYTE, GPT2_SPLIT, byte_to_unicode, build_from_gguf

__all__ = ["Tokenizer"]

_BYTE_TOKEN = re.compile(r"<0x([0-9A-Fa-f]{2})>")


class Tokenizer:
    """Text ↔ token ids for one model.

    Attributes:
        inner: The wrapped ``tokenizers.Tokenizer``.
        kind: ``"byte_level"`` (GPT-2 style) or ``"sentencepiece"`` (``▁`` spaces, byte fallback).
    """

    def __init__(
        self,
        inner: HFTokenizer,
        kind: str,
        *,
        vocab_size: int | None = None,
        bos_id: int | None = None,
        eos_ids: Iterable[int] = (),
        split_regex: str = "",
        byte_ids: Iterable[int] = (),
        chat_template: str | None = None,
    ) -> None:
        """Wrap ``inner``.

        Args:
            inner: The tokenizer (added tokens marked special are the special tokens).
            kind: ``"byte_level"`` or ``"sentencepiece"``.
            vocab_size: Rows of the model's embedding (default: the tokenizer's size).
            bos_id: Beginning-of-sequence token, if the model has one.
            eos_ids: Tokens that end generation.
            split_regex: The pre-tokenization regex ("" when there is none).
            byte_ids: SentencePiece byte-fallback tokens (``<0xNN>``) — others with that
                spelling are literal text.
            chat_template: The model's Jinja chat template, if it ships one.
        """
        if kind not in ("byte_level", "sentencepiece"):
            raise ValueError(f"kind must be 'byte_level' or 'sentencepiece', got {kind!r}")
        self.inner = inner
        self.kind = kind
        self._vocab_size = vocab_size if vocab_size is not None else inner.get_vocab_size(with_added_tokens=True)
        self._bos_id = bos_id
        self._eos_ids = tuple(dict.fromkeys(eos_ids))
        self._split_regex = split_regex
        self._byte_ids = frozenset(byte_ids)
        self.chat_template = chat_template
        added = inner.get_added_tokens_decoder()
        self._special_ids = frozenset(i for i, t in added.items() if t.special)
        self._added_ids = frozenset(added)
        self._bytes: list[bytes] | None = None

    # -- construction ---------------------------------------------------------------------

    @classmethod
    def from_gguf(cls, gguf: GGUFFile | str | Path) -> Tokenizer:
        """Build from a GGUF file's tokenizer metadata.

        Raises:
            Unsupported: The file's tokenizer model is neither ``gpt2`` nor ``llama``.
        """
        f = gguf if isinstance(gguf, GGUFFile) else GGUFFile(gguf)
        parts = build_from_gguf(f.metadata, f.architecture)
        eos = [f.get(k) for k in ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id")]
        bytes_ids = [i for i, k in enumerate(parts.token_types) if k == BYTE]
        bos = f.get("tokenizer.ggml.bos_token_id")
        return cls(
            parts.tokenizer,
            parts.kind,
            vocab_size=len(parts.tokens),
            bos_id=None if bos is None else int(bos),
            eos_ids=[int(e) for e in eos if e is not None],
            split_regex=parts.split_regex,
            byte_ids=bytes_ids,
            chat_template=f.get("tokenizer.chat_template"),
        )

    @classmethod
    def from_hf_folder(cls, path: str | Path, vocab_size: int | None = None) -> Tokenizer:
        """Build from a Hugging Face folder's ``tokenizer.json`` (+ ``tokenizer_config.json``,
        ``generation_config.json`` for BOS/EOS and the chat template).

        Raises:
            NotFound: The folder has no ``tokenizer.json``.
        """
        folder = Path(path)
        file = folder / "tokenizer.json"
        if not file.is_file():
            raise NotFound(f"{folder} has no tokenizer.json")
        inner = HFTokenizer.from_file(str(file))
        spec = json.loads(file.read_text(encoding="utf-8"))
        config = _read_json(folder / "tokenizer_config.json")
        generation = _read_json(folder / "generation_config.json")
        kind = "byte_level" if "ByteLevel" in json.dumps(spec.get("decoder")) else "sentencepiece"
        bos = _token_id(inner, config.get("bos_token"))
        eos_ids = [_token_id(inner, config.get("eos_token"))]
        gen_eos = generation.get("eos_token_id")
        eos_ids += gen_eos if isinstance(gen_eos, list) else [gen_eos]
        vocab = spec.get("model", {}).get("vocab", {})
        byte_ids = [i for t, i in vocab.items() if _BYTE_TOKEN.fullmatch(t)] if isinstance(vocab, dict) else []
        template = config.get("chat_template")
        if template is None and (folder / "chat_template.jinja").is_file():
            template = (folder / "chat_template.jinja").read_text(encoding="utf-8")
        return cls(
            inner,
            kind,
            vocab_size=vocab_size,
            bos_id=bos,
            eos_ids=[e for e in eos_ids if isinstance(e, int)],
            split_regex=_find_regex(spec.get("pre_tokenizer")),
            byte_ids=byte_ids if kind == "sentencepiece" and spec.get("model", {}).get("byte_fallback") else (),
            chat_template=template if isinstance(template, str) else None,
        )

    def save(self, path: str | Path) -> None:
        """Write this tokenizer (``tokenizers`` JSON plus our facts) to one file."""
        meta = {
            "kind": self.kind,
            "vocab_size": self._vocab_size,
            "bos_id": self._bos_id,
            "eos_ids": list(self._eos_ids),
            "split_regex": self._split_regex,
            "byte_ids": sorted(self._byte_ids),
            "chat_template": self.chat_template,
        }
        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".{target.name}.tmp")
        tmp.write_text(json.dumps({"pie_tokenizer": 1, "meta": meta, "tokenizer": self.inner.to_str()}), encoding="utf-8")
        tmp.replace(target)

    @classmethod
    def load(cls, path: str | Path) -> Tokenizer:
        """Read a file written by :meth:`save`.

        Raises:
            ValueError: Not such a file.
        """
        data = json.loads(Path(path).read_text(encoding="utf-8"))
        if data.get("pie_tokenizer") != 1:
            raise ValueError(f"{path} is not a saved pie tokenizer")
        meta = data["meta"]
        return cls(
            HFTokenizer.from_str(data["tokenizer"]),
            meta["kind"],
            vocab_size=meta["vocab_size"],
            bos_id=meta["bos_id"],
            eos_ids=meta["eos_ids"],
            split_regex=meta["split_regex"],
            byte_ids=meta["byte_ids"],
            chat_template=meta["chat_template"],
        )

    # -- the SDK surface ------------------------------------------------------------------

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text``; special tokens written in it are recognised, no BOS is added."""
        return list(self.inner.encode(text, add_special_tokens=False).ids)

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        """:meth:`encode` for many texts at once (parallel inside ``tokenizers``)."""
        return [list(e.ids) for e in self.inner.encode_batch(list(texts), add_special_tokens=False)]

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        """Text of ``ids`` (invalid UTF-8 becomes U+FFFD)."""
        return str(self.inner.decode(list(ids), skip_special_tokens=skip_special_tokens))

    def token_bytes(self, ids: Iterable[int]) -> list[bytes]:
        """The raw bytes each token contributes to the output text.

        Byte-level tokens map back through GPT-2's byte alphabet; SentencePiece tokens turn
        ``▁`` into a space and ``<0xNN>`` into that byte; added and special tokens give
        their text. Concatenating them and decoding as UTF-8 reproduces :meth:`decode`.
        """
        table = self._table()
        return [table[i] if 0 <= i < len(table) else b"" for i in ids]

    def vocabs(self) -> tuple[list[int], list[bytes]]:
        """Every token id of the model's vocabulary with its bytes (see :meth:`token_bytes`)."""
        table = self._table()
        return list(range(len(table))), list(table)

    def special_tokens(self) -> tuple[list[int], list[bytes]]:
        """Ids of the special (control) tokens with their text as bytes, by id."""
        ids = sorted(self._special_ids)
        return ids, [(self.inner.id_to_token(i) or "").encode("utf-8") for i in ids]

    def split_regex(self) -> str:
        """The regex text is split by before BPE ("" for SentencePiece models)."""
        return self._split_regex

    def token_to_id(self, text: str) -> int | None:
        """Id of the token spelled ``text`` in the vocabulary, or ``None``."""
        found = self.inner.token_to_id(text)
        return None if found is None else int(found)

    def id_to_token(self, token_id: int) -> str | None:
        """Spelling of ``token_id`` in the vocabulary, or ``None``."""
        return self.inner.id_to_token(token_id)

    @property
    def vocab_size(self) -> int:
        """Number of token ids the model scores (its embedding rows)."""
        return self._vocab_size

    @property
    def bos_id(self) -> int | None:
        """Beginning-of-sequence id, if the model has one."""
        return self._bos_id

    @property
    def eos_ids(self) -> tuple[int, ...]:
        """Ids that end a generation (from the checkpoint's metadata)."""
        return self._eos_ids

    @property
    def special_ids(self) -> frozenset[int]:
        """Ids of all special tokens."""
        return self._special_ids

    def is_special(self, token_id: int) -> bool:
        """Whether ``token_id`` is a special token."""
        return token_id in self._special_ids

    # -- internals ------------------------------------------------------------------------

    def _table(self) -> list[bytes]:
        if self._bytes is None:
            self._bytes = self._build_table()
        return self._bytes

    def _build_table(self) -> list[bytes]:
        size = self._vocab_size
        spell = self.inner.id_to_token
        table: list[bytes] = []
        if self.kind == "byte_level":
            back = {c: b for b, c in byte_to_unicode().items()}
            for i in range(size):
                text = spell(i)
                if text is None:
                    table.append(b"")
                elif i in self._added_ids or not all(c in back for c in text):
                    table.append(text.encode("utf-8"))
                else:
                    table.append(bytes(back[c] for c in text))
        else:
            for i in range(size):
                text = spell(i)
                if text is None:
                    table.append(b"")
                elif i in self._byte_ids and (m := _BYTE_TOKEN.fullmatch(text)):
                    table.append(bytes([int(m.group(1), 16)]))
                elif i in self._added_ids:
                    table.append(text.encode("utf-8"))
                else:
                    table.append(text.replace("▁", " ").encode("utf-8"))
        return table

    def __repr__(self) -> str:
        return f"Tokenizer(kind={self.kind!r}, vocab_size={self._vocab_size}, specials={len(self._special_ids)})"


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    data = json.loads(path.read_text(encoding="utf-8"))
    return data if isinstance(data, dict) else {}


def _token_id(inner: HFTokenizer, token: Any) -> int | None:
    if isinstance(token, dict):
        token = token.get("content")
    if not isinstance(token, str):
        return None
    found = inner.token_to_id(token)
    return None if found is None else int(found)


def _find_regex(node: Any) -> str:
    """The first ``Split`` regex in a serialised pre-tokenizer tree."""
    if isinstance(node, dict):
        if node.get("type") == "Split" and isinstance(node.get("pattern"), dict) and "Regex" in node["pattern"]:
            return str(node["pattern"]["Regex"])
        if node.get("type") == "ByteLevel" and node.get("use_regex", True):
            return GPT2_SPLIT
        for child in node.get("pretokenizers", []) or []:
            found = _find_regex(child)
            if found:
                return found
    return ""
