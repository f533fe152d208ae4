"""The WebAssembly runner: inferlets run as a component (the SDK and a guest runtime built by
componentize-py) in wasmtime, and reach the engine only through the WIT imports of ``wit/``."""
