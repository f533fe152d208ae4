"""Standard-library modules the sandbox cannot have, and the one-line error importing one raises.

The list is what fails in the guest (CPython 3.14 for WASI, as componentize-py builds it): C
modules it is built without, and the pure-Python modules that need them, which the build
leaves out of ``/python`` (:mod:`pie_guest.stdlib`) so that importing one names it. The
finder sits last on ``sys.meta_path``: a module of these names that the inferlet vendors
itself is still found first.
"""

import sys

__all__ = ["UNAVAILABLE", "UnavailableFinder", "install", "message"]


def _each(why: str, *names: str) -> dict[str, str]:
    return dict.fromkeys(names, why)


def _built_without(lib: str, instead: str) -> str:
    return f"the sandbox's CPython is built without {lib}; {instead}"


_COMPRESSION = "zlib, gzip and zipfile work"
_DBM = "dbm.dumb and sqlite3 work"

UNAVAILABLE: dict[str, str] = {
    **_each("WASI has no TLS or sockets", "ssl", "_ssl"),
    **_each("WASI has no processes or threads", "multiprocessing", "_multiprocessing", "_posixsubprocess",
            "_posixshmem"),
    **_each("pip needs processes and a network; vendor pure-Python packages in the inferlet's folder", "ensurepip"),
    **_each("the sandbox's CPython is built without subinterpreters", "_interpreters", "_interpqueues",
            "_interpchannels", "concurrent.interpreters", "concurrent.futures.interpreter"),
    **_each("WASI cannot inspect other processes", "_remote_debugging", "asyncio.tools"),
    **_each("WASI cannot load native libraries", "ctypes", "_ctypes"),
    **_each(_built_without("libbz2", _COMPRESSION), "bz2", "_bz2", "compression.bz2", "encodings.bz2_codec"),
    **_each(_built_without("liblzma", _COMPRESSION), "lzma", "_lzma", "compression.lzma"),
    **_each(_built_without("libzstd", _COMPRESSION), "_zstd", "compression.zstd"),
    **_each(_built_without("gdbm", _DBM), "dbm.gnu", "_gdbm"),
    **_each(_built_without("ndbm", _DBM), "dbm.ndbm", "_dbm"),
    **_each(_built_without("OpenSSL", "hashlib works with its built-in hashes"), "_hashlib"),
    **_each(_built_without("libuuid", "uuid works without it"), "_uuid"),
    **_each("WASI has no terminal", "curses", "_curses", "_curses_panel", "readline", "termios", "tty", "pty"),
    **_each("the sandbox has no display and no Tk", "tkinter", "_tkinter", "turtle", "turtledemo", "idlelib"),
    **_each("WASI has no file locks", "fcntl"),
    **_each("WASI has no users or groups", "grp", "pwd"),
    **_each("WASI has no resource limits; the engine caps the sandbox's memory and time", "resource"),
    **_each("WASI has no syslog; print to stderr, which the engine forwards", "syslog"),
    **_each("WASI has no memory-mapped files", "mmap"),
    **_each("it is for Windows only", "msvcrt", "nt", "winreg", "winsound", "_winapi", "_wmi", "_overlapped",
            "asyncio.windows_events", "asyncio.windows_utils", "encodings.mbcs", "encodings.oem"),
    **_each("it is for macOS only", "_scproxy"),
}
"""Each module the sandbox cannot import, and why (the middle of its error message)."""


def message(name: str) -> str:
    """The one-line error for importing ``name``, one of :data:`UNAVAILABLE`."""
    return (f"{name} is not available in the Pie wasm sandbox ({UNAVAILABLE[name]}); "
            f"run the inferlet with --isolation process if it needs it")


class UnavailableFinder:
    """Last on ``sys.meta_path``: a module no other finder found and that the sandbox cannot
    have raises ``ModuleNotFoundError`` with :func:`message` instead of a bare ``No module
    named`` (so ``except ImportError`` fallbacks, as in ``http.client``, still work)."""

    @staticmethod
    def find_spec(fullname: str, path: object = None, target: object = None) -> None:
        if fullname in UNAVAILABLE:
            raise ModuleNotFoundError(message(fullname), name=fullname)
        return None

    @staticmethod
    def invalidate_caches() -> None:
        """Nothing cached."""


def install() -> None:
    """Put :class:`UnavailableFinder` last on ``sys.meta_path`` (once)."""
    if UnavailableFinder not in sys.meta_path:
        sys.meta_path.append(UnavailableFinder)
