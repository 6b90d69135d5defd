"""Discrete-event simulator of a disaggregated GEN pool (docs/design.md#simulator).

Pure modules only: workloads and the step-time model take text and seeds in and
never touch files, clocks or devices; the CLI does the I/O.
"""
