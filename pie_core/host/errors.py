"""Host interface ``errors``: the error kinds a host call raises, as inferlets see them."""

from pie_core.errors import InvalidInput, NotFound, OutOfPages, PieError, Unsupported

__all__ = ["PieError", "InvalidInput", "OutOfPages", "Unsupported", "NotFound"]
