"""``python -m conformance dashboard``: a static site comparing result bundles of many runtimes and runs.

The site is plain files (HTML, one stylesheet, one small script) that work from ``file://`` with no server
and no network: an index with a matrix of runs by spec area and level, pages per area (clauses and their
cases) and per case (its spec sentences with their lines, model, inputs, expectation and every run's
outcome, with the classification of a peer failure from docs/peer-deviations.md), and a comparison of
two runs of one runtime. Bundles are untrusted: they are read through ``conformance.bundle_files`` and
every string from them is escaped (see ``runs`` and ``build``).
"""

from __future__ import annotations

from conformance.dashboard.areas import area_of

__all__ = ["area_of"]
