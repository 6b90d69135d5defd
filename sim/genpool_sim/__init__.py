"""Discrete-event simulator of a disaggregated GEN pool (DESIGN.md §9).

Pure modules only: workloads and the step-time model take text and seeds in and
never touch files, clocks or devices; the CLI does the I/O.
"""
