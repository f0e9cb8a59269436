"""Exceptions raised by the Chunked Hash Tree; every one leaves the tree unchanged."""


class CHTError(Exception):
    """Base class: the operation was refused and the tree is exactly as before the call."""


class DuplicateRequest(CHTError):
    """`insert` of a request id the tree already holds."""


class UnknownRequest(CHTError, KeyError):
    """An operation named a request id the tree does not hold."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else "unknown request"


class InvalidTransition(CHTError):
    """The request exists but is in the wrong state (e.g. `activate` of a running request)."""


class EmptyPrompt(CHTError, ValueError):
    """A prompt with no tokens (or an empty hash list) has no prefix to share."""


class InvalidTokens(CHTError, ValueError):
    """Token ids must be integers in [0, 2**32)."""


class HashChainError(CHTError, ValueError):
    """Precomputed hashes that are not one chain (not cumulative, a 64-bit collision) or not in [0, 2**64)."""


class InvalidArrival(CHTError, ValueError):
    """An arrival time that cannot be ordered: NaN, or not a number at all."""


class InvalidDepth(CHTError, ValueError):
    """A prefix depth that is not an integer or lies outside what the query allows for the request."""


class InvalidNamespace(CHTError, TypeError):
    """A namespace (LoRA id, cache salt) that is neither a str nor None."""


class InvalidPages(CHTError, ValueError):
    """An engine's KV-cache page event the adapters cannot translate: page hashes that are not integers (ints
    or numpy integers) or repeat within one chain, a page size that is not an integer in [1, 2**32), or tokens
    that do not fill the pages."""
