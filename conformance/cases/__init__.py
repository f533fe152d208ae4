"""The conformance cases, one module per surface (collected by ``pytest --pyargs conformance``)."""
