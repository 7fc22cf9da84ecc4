"""The suite measures its own detection power: built-in faulty runtimes (the reference with one
realistic bug each), the audit that runs the suite on them, and the spec-coverage table it feeds.

``python -m conformance audit`` runs it; see ``docs/conformance.md`` ("Auditing the suite").
"""
