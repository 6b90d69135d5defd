"""GenPool benchmarks (DESIGN.md §15): JSON results, never timed assertions in tests.

Run them with ``python -m bench.run [NAME ...]`` from the repository root.
"""
