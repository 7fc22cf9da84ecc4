"""The conformance corpus: case manifests (cases/), their builders (builders/), fuzz seeds, dictionaries
and regressions. Only ``corpus.builders`` is Python."""
