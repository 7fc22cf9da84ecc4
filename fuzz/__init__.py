"""Fuzzing harness for the custom, quantized and persistent values contract.

Generators (``fuzz.gen``, ``fuzz.mutators``) build valid and near-valid inputs from a ``fuzz.source``
of choices, so the same code serves Hypothesis strategies (``fuzz.strategies``), structure-aware
atheris targets (``fuzz/*_fuzzer.py``) and seed corpora. ``python -m fuzz`` runs campaigns, triages
and promotes findings (see docs/fuzzing.md).
"""
