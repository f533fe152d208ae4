"""Guest side of the wasm runner: the event loop, host calls and the inferlet's entry."""
