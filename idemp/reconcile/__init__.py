"""Reconciliation on PySpark: dedup records × message history × offsets → a report.

``idemp reconcile --history … --records … --offsets … --out DIR``; see ``cli.py``.
Modules: ``schemas`` (the canonical inputs), ``loaders`` (one per source), ``job``
(pure DataFrame transformations), ``report`` (outputs), ``cli``.
"""
