"""Models and tokenizers: ``Model.load(name)``, ``model.tokenizer()``."""

from __future__ import annotations

from inferlet.host import model as _host

__all__ = ["Model", "Tokenizer"]


class Tokenizer:
    """The tokenizer of a loaded model."""

    def __init__(self, model: Model) -> None:
        self._name = model.name

    def encode(self, text: str) -> list[int]:
        """Text to token ids (special tokens in the text are recognised; no BOS is added)."""
        return _host.tokenize(self._name, text)

    def decode(self, tokens: list[int]) -> str:
        """Token ids to text."""
        return _host.detokenize(self._name, tokens)

    def vocabs(self) -> tuple[list[int], list[bytes]]:
        """Full vocabulary as parallel lists of ids and token bytes."""
        return _host.vocabs(self._name)

    def special_tokens(self) -> tuple[list[int], list[bytes]]:
        """Special token ids (BOS, EOS, control tokens) and their bytes."""
        return _host.special_tokens(self._name)

    def split_regex(self) -> str:
        """The split regex used during BPE pre-tokenization."""
        return _host.split_regex(self._name)


class Model:
    """A model the engine has loaded. Get one with :meth:`Model.load`."""

    def __init__(self, name: str) -> None:
        self.name = name

    @staticmethod
    def load(name: str) -> Model:
        """Bind to a loaded model.

        Args:
            name: The ``[model.<name>]`` key in ``~/.pie/config.toml`` (or a built-in name);
                ``runtime.models()`` lists what is loaded.

        Raises:
            NotFound: The model is not loaded; the message lists those that are.
        """
        _host.resolve(name)
        return Model(name)

    def tokenizer(self) -> Tokenizer:
        """The model's tokenizer."""
        return Tokenizer(self)

    @property
    def vocab_size(self) -> int:
        """Number of token ids the model accepts and scores."""
        return _host.vocab_size(self.name)

    def __repr__(self) -> str:
        return f"Model({self.name!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Model) and other.name == self.name

    def __hash__(self) -> int:
        return hash(self.name)
