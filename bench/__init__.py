"""GenPool benchmarks: JSON results, never timed assertions in tests.

See docs/design.md#testing-and-benchmarks.

Run them with ``python -m bench.run [NAME ...]`` from the repository root.
"""
