"""Benchmarks: commands that measure and write results files (never timed tests)."""
